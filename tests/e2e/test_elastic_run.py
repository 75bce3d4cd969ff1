"""``potluck run --elastic``: a worker SIGKILLed mid-run is restarted and rejoins.

The other workers redo the step without it (nothing lost, nothing trained twice); the
launcher restarts it as a new member; it is admitted at a step boundary with the live
state. Every step trains on the same global batch (equal shares, mean loss), so the
final parameters equal one process training on the same global batches, up to
floating-point summation order (float64: 1e-9 relative).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from potluck import DataCursor
from tests.e2e.helpers import ROOT, potluck_run

SCRIPT = ROOT / "examples" / "elastic.py"
EPOCHS = 3


def _one_process() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(96, 8, generator=gen, dtype=torch.float64),
                         torch.randn(96, 1, generator=gen, dtype=torch.float64))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                              torch.nn.Linear(32, 1)).double()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    cursor = DataCursor(len(data), 12, seed=3)
    while cursor.epoch < EPOCHS:
        x, y = data[cursor.global_indices()]
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        cursor.commit()
    return net.state_dict()


@pytest.mark.timeout(150)
def test_killed_worker_is_restarted_and_rejoins_with_live_state(tmp_path: Path) -> None:
    out = tmp_path / "final.pt"
    result = potluck_run("--nproc-per-node", "3", "--elastic", "--max-restarts", "1",
                         "--token", "s3cret", str(SCRIPT), "--epochs", str(EPOCHS),
                         "--fail-at", "4", "--step-time", "0.05", "--out", str(out),
                         timeout=140)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "a worker was lost (elastic: the others train on)" in result.stderr
    assert "restarting local rank 1 as a new member" in result.stderr
    assert "joined at step" in result.stdout + result.stderr
    assert "s3cret" not in result.stdout + result.stderr  # the token is never printed
    final, expected = torch.load(out), _one_process()
    for name, value in expected.items():
        torch.testing.assert_close(final[name], value, rtol=1e-9, atol=1e-12)
