"""Trust accuses no honest worker on a workload unlike the bench's MLP: a small
character transformer, one sample per worker a step, real text, several seeds
(``bench/byzantine_lm.py``); and on a fixed cohort a quarantined rank's samples are
trained by the others."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from potluck.testing import free_port, run_ranks
from potluck_lab.bench import byzantine_lm


@pytest.mark.timeout(300)  # (three jobs of about 10-25 s each, 90 s at most)
def test_honest_small_batches_of_a_transformer_are_never_quarantined() -> None:
    # Under the rule of two far strikes within Rules.memory, seed 2 quarantined an
    # honest worker (far at steps 7 and 24).
    far_steps = 0
    for seed in (0, 2, 3):
        result = run_ranks(byzantine_lm.run_rank, 4, free_port(), seed, init_group=False,
                           timeout=90)[0]
        assert result["steps"] == byzantine_lm.STEPS
        assert result["quarantined"] == [], (seed, result)
        far_steps += len(result["far"])
        assert result["needed"] >= 2
    assert far_steps >= 3  # the workload does put honest copies far: the rule was tried


def _attacked_ledger(rank: int, world_size: int, port: int) -> dict[str, Any]:
    import potluck
    from potluck_lab.attacks import Attack
    from potluck_lab.bench.byzantine_job import ATTACKER, join

    cohort = join(rank, world_size, port)
    torch.manual_seed(0)
    x = torch.randn(96, 8)
    data = torch.utils.data.TensorDataset(x, (x.sum(1) > 0).long(), torch.arange(96))
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    wrapped, opt, loader = potluck.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1),
                                           data, global_batch=12, cohort=cohort,
                                           trust=potluck.Trust())
    part = opt.part(potluck.trust.TrustPart)
    wrapped.register_comm_hook(None, Attack(part.exchange, "sign_flip", rank == ATTACKER))
    seen: list[tuple[int, list[int]]] = []  # (step, the sample ids this rank trained on)
    for xb, yb, ids in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(wrapped(xb), yb).backward()
        trusted = rank in part.trusted(world_size)
        opt.step()
        seen.append((opt.steps, ids.tolist() if trusted else []))
    out = {"seen": seen, "quarantined": list(part.quarantined)}
    opt.finish()
    return out


@pytest.mark.timeout(120)
def test_a_quarantined_ranks_samples_are_trained_by_the_others_on_a_fixed_cohort() -> None:
    """Every sample of an epoch is trained exactly once by the trusted ranks: after the
    quarantine the others split each whole step (before, its part was dropped)."""
    results = run_ranks(_attacked_ledger, 4, free_port(), init_group=False, timeout=100)
    assert results[0]["quarantined"] == ["rank3"]
    steps = [step for step, _ in results[0]["seen"]]
    assert steps == list(range(1, 9))  # 96 samples in steps of 12
    out_at = next(step for step, ids in results[3]["seen"] if not ids)
    assert out_at <= 4  # sign_flip is quarantined within a few steps
    trained = sorted(i for r in results for _, ids in r["seen"] for i in ids)
    assert trained == list(range(96))  # each sample once, by a rank trusted then
    for step in range(out_at, 9):  # the trusted three split each whole step
        assert sum(len(ids) for r in results for s, ids in r["seen"] if s == step) == 12
