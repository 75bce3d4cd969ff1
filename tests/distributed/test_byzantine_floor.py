"""The trust bench's floor (``bench/byzantine_floor.py``): its synchronizations (one
all-reduce; trust's two all-to-alls with a plain mean between; trust's design in raw
torch, with an audit and three spot checkers) train the same model, so the floor's step
times compare like with like."""

from __future__ import annotations

import pytest
import torch

from potluck.testing import RankFailed, run_ranks
from potluck_lab.bench.byzantine_floor import run_floor
from potluck_lab.bench.byzantine_job import model


@pytest.mark.timeout(120)
def test_both_floors_take_the_same_steps() -> None:
    steps = 4  # (spot checks in steps 0 and 2; an audit in every step)
    ends = {mode: run_ranks(run_floor, 4, {"mode": mode, "steps": steps}, timeout=100)
            for mode in ("allreduce", "alltoall", "robust_spot3")}
    for mode, results in ends.items():
        assert all(len(r["times"]) == steps for r in results), mode
        for r in results[1:]:  # every replica ends alike
            assert torch.equal(r["parameters"], results[0]["parameters"]), mode
    reduced = ends["allreduce"][0]["parameters"]
    initial = torch.cat([p.detach().reshape(-1) for p in model(0).parameters()])
    assert (reduced - initial).abs().max() > 1e-3  # it trained
    # the same mean, summed in another order (and CenteredClip's clean case is the mean:
    # the robust floor raises if it clips)
    for mode in ("alltoall", "robust_spot3"):
        torch.testing.assert_close(ends[mode][0]["parameters"], reduced, rtol=1e-5,
                                   atol=1e-6)
    with pytest.raises(RankFailed, match="mode 'ring'"):
        run_ranks(run_floor, 1, {"mode": "ring", "steps": 1}, timeout=60)
