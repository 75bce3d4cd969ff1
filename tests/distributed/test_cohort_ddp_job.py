"""The cohort bench's torch DDP job under the real torchrun, 2 ranks on loopback: a run
stopped after a step past its checkpoint and started again (it resumes from the
checkpoint and redoes the steps since) ends bitwise equal to the same run uninterrupted,
and its ranks' replicas are equal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from potluck.testing import free_port
from potluck_lab.jobs import kill_tree

JOB = ["--samples", "96", "--global-batch", "8", "--epochs", "2", "--d-model", "16",
       "--layers", "1", "--corpus-chars", "20000", "--held-out", "8", "--eval-every", "4",
       "--checkpoint-every", "5"]  # 12 steps an epoch


def _torchrun(run_dir: Path, node_dir: Path, *extra: str) -> None:
    """The job on 2 local ranks; its processes are killed if it overstays."""
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}", "--local-addr", "127.0.0.1", "-m",
            "potluck_lab.cohort_ddp_job", "--run-dir", str(run_dir), "--node-dir",
            str(node_dir), "--host", "0", *JOB, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    with (run_dir / "torchrun.log").open("ab") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=100)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)  # (torchrun starts its workers in sessions of their own)
            proc.wait()
            raise
    assert code == 0, (run_dir / "torchrun.log").read_text()[-3000:]


def _finals(run_dir: Path) -> list[dict[str, torch.Tensor]]:
    return [torch.load(p) for p in sorted(run_dir.glob("node0-*.pt"))]


@pytest.mark.slow
@pytest.mark.serial  # (its torchrun jobs ran past 100 s beside another xdist worker in CI)
@pytest.mark.timeout(300)
def test_a_run_resumed_from_its_checkpoint_equals_the_run_uninterrupted(tmp_path: Path) -> None:
    _torchrun(tmp_path / "whole", tmp_path / "whole-checkpoints")
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "stop").write_text("12")  # after step 12; its checkpoint is at 10
    _torchrun(tmp_path / "cut", tmp_path / "cut-checkpoints", "--stop-file",
              str(tmp_path / "cut" / "stop"))
    for stale in (tmp_path / "cut").glob("node0-*.pt"):
        stale.unlink()
    _torchrun(tmp_path / "cut", tmp_path / "cut-checkpoints")
    whole, resumed = _finals(tmp_path / "whole"), _finals(tmp_path / "cut")
    assert len(whole) == len(resumed) == 2
    for state in [whole[1], *resumed]:  # replicas equal, and equal to the uninterrupted run
        assert all(torch.equal(state[k], whole[0][k]) for k in whole[0])
    starts = [json.loads(line) for p in (tmp_path / "cut").glob("node0-*.log")
              for line in p.read_text().splitlines() if '"start"' in line]
    assert sorted(r["resumed"] for r in starts) == [0, 0, 10, 10]
