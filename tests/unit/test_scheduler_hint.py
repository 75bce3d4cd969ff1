"""torch's LR schedulers on ``prepare``'s optimizer: torch's own TypeError, and the hint
``potluck run``'s worker bootstrap adds under it (one process, and the bootstrap run on a
script as ``potluck run`` starts it)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import TensorDataset

import potluck
from potluck.errors import hint


def test_a_scheduler_on_the_step_transaction_gets_the_fix_and_the_torch_optimizer_works(
        ) -> None:
    net = torch.nn.Linear(2, 1)
    data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    model, opt, loader = potluck.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1),
                                         data, global_batch=4)
    try:
        with pytest.raises(TypeError, match="StepTransaction is not an Optimizer") as caught:
            StepLR(opt, step_size=1)  # type: ignore[arg-type]
        note = hint(caught.value)
        assert note is not None and "StepLR(opt.optimizer, ...)" in note
        scheduler = StepLR(opt.optimizer, step_size=1, gamma=0.5)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # torch warns of a scheduler stepped first
            for x, y in loader:
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                scheduler.step()
        assert opt.param_groups[0]["lr"] == pytest.approx(0.025)  # two steps
    finally:
        opt.finish()


def test_other_errors_get_no_hint() -> None:
    assert hint(TypeError("Linear is not an Optimizer")) is None
    assert hint(ValueError("StepTransaction is not an Optimizer")) is None


SCRIPT = """
import torch
from torch.optim.lr_scheduler import StepLR
import potluck
net = torch.nn.Linear(2, 1)
data = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
_, opt, _ = potluck.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), data,
                            global_batch=4)
StepLR(opt, step_size=1)
"""


@pytest.mark.timeout(60)
def test_the_worker_bootstrap_prints_the_hint_under_torchs_traceback(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("POTLUCK_", "TORCHELASTIC_")) and k not in (
                   "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-m", "potluck.launch.worker", str(script)],
                          env=environ, capture_output=True, text=True, timeout=50,
                          check=False)
    assert done.returncode == 1
    tail = done.stderr.strip().splitlines()[-2:]
    assert tail[0] == "TypeError: StepTransaction is not an Optimizer", done.stderr[-2000:]
    assert "StepLR(opt.optimizer, ...)" in tail[1]
