"""One script, every launcher: ``examples/elastic.py`` (written with ``potluck.prepare``)
runs unchanged as one plain process, under ``potluck run`` (a fixed cohort) and under
``torchrun``, and ends with the parameters of one process training on the same global
batches (its elastic runs, with a worker killed mid-run, are in ``test_elastic_run``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from potluck.testing import free_port
from tests.e2e.helpers import ROOT, SCRIPT, assert_equal_to_one_process, potluck_run

EPOCHS = 2
ARGS = ("--epochs", str(EPOCHS), "--step-time", "0")


@pytest.mark.timeout(90)
def test_as_one_plain_process(tmp_path: Path) -> None:
    out = tmp_path / "final.pt"
    done = subprocess.run([sys.executable, str(SCRIPT), *ARGS, "--out", str(out)],
                          capture_output=True, text=True, timeout=80, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"epoch {EPOCHS - 1} done at step {EPOCHS * 8} with 1 workers" in done.stdout
    assert_equal_to_one_process(out, EPOCHS)


@pytest.mark.timeout(120)
def test_under_potluck_run_as_a_fixed_job(tmp_path: Path) -> None:
    out = tmp_path / "final.pt"
    done = potluck_run("--nproc-per-node", "2", str(SCRIPT), *ARGS, "--out", str(out),
                       "--checkpoint-dir", str(tmp_path / "ckpt"), timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"[rank0]: epoch {EPOCHS - 1} done at step {EPOCHS * 8} with 2 workers" \
        in done.stdout
    assert_equal_to_one_process(out, EPOCHS)


@pytest.mark.timeout(120)
def test_under_torchrun(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None, "torchrun ships with torch; the venv lacks it"
    out = tmp_path / "final.pt"
    done = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()), str(SCRIPT),
         *ARGS, "--out", str(out), "--checkpoint-dir", str(tmp_path / "ckpt")],
        capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"epoch {EPOCHS - 1} done at step {EPOCHS * 8} with 2 workers" in done.stdout
    assert_equal_to_one_process(out, EPOCHS)


def test_prepare_refuses_what_it_decides_itself() -> None:
    from potluck import BalanceConfig, DataParallel, Trust, prepare, weighted_mean
    from potluck.errors import ConfigError
    from potluck.step.parts import EqualShares
    from potluck.trust import SpotCheck

    net = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    with pytest.raises(ConfigError, match="on_failure="):
        prepare(net, sgd, data, global_batch=4, on_failure="raise")
    with pytest.raises(ConfigError, match="global_batch=0"):
        prepare(net, sgd, data, global_batch=0)
    with pytest.raises(ConfigError, match="plain model"):
        prepare(DataParallel(net), sgd, data, global_batch=4)
    with pytest.raises(ConfigError, match="balance='yes': pass True"):
        prepare(net, sgd, data, global_batch=4, balance="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"shares= with balancing .*balancing is a share policy"):
        prepare(net, sgd, data, global_batch=4, balance=True, shares=EqualShares())
    with pytest.raises(ConfigError, match="comm_hook= with balance= or weight="):
        prepare(net, sgd, data, global_batch=4, weight=len, comm_hook=weighted_mean)
    with pytest.raises(ConfigError, match="weight=3 must be a function of the batch"):
        prepare(net, sgd, data, global_batch=4, weight=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_micro_batch=0 is invalid"):
        prepare(net, sgd, data, global_batch=4, max_micro_batch=0)
    with pytest.raises(ConfigError, match="disagree: give this rank's cap once"):
        prepare(net, sgd, data, global_batch=4, max_micro_batch=4,
                balance=BalanceConfig(max_micro_batch=8))
    spot = Trust(spot_check=SpotCheck(lambda model, batch: model(batch[0]).sum()))
    with pytest.raises(ConfigError, match=r"Trust\(spot_check=...\) with a memory cap"):
        prepare(net, sgd, data, global_batch=4, max_micro_batch=4, trust=spot)


def test_prepare_refuses_what_cannot_go_with_a_sync_strategy() -> None:
    from potluck import DiLoCo, LocalSGD, prepare
    from potluck.compress import CompressedSum, Int8Blockwise
    from potluck.errors import ConfigError

    net = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    with pytest.raises(ConfigError, match=r"balancing .* with DiLoCo\(adaptive=False\)"):
        prepare(net, sgd, data, global_batch=4, sync=LocalSGD(4, adaptive=False), balance=True)
    with pytest.raises(ConfigError, match="comm_hook="):
        prepare(net, sgd, data, global_batch=4, sync=DiLoCo(),
                comm_hook=CompressedSum(Int8Blockwise()))
    with pytest.raises(ConfigError, match=r"sync='diloco': pass potluck\.DiLoCo"):
        prepare(net, sgd, data, global_batch=4, sync="diloco")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="inner_steps=0"):
        DiLoCo(inner_steps=0)
    with pytest.raises(ConfigError, match="Nesterov needs momentum"):
        DiLoCo(outer_momentum=0.0)
    with pytest.raises(ConfigError, match="one positive number of local steps per rank"):
        DiLoCo(split=(3, 0))
