"""The work check under rounds on 4 Gloo ranks (``Trust(round_check=RoundCheck(loss))``):
it changes nothing in a clean run (the global models equal a run without it, bit for
bit: it reads the model through a functional copy, under a forked RNG), and a member
that sends another member's pseudo-gradient is quarantined while the member it copied
is not."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from potluck.testing import free_port, run_ranks

COPIER, COPIED_RANK, ROUNDS, H, GLOBAL_BATCH = 3, 1, 8, 8, 64
FEATURES, CLASSES, HIDDEN = 16, 4, 128
COPY_FROM = 4  # the copier trains honestly for 3 rounds, then copies


def _data() -> torch.utils.data.TensorDataset:
    """A teacher's noisy labels on Gaussian inputs: a network fits its own samples'
    noise a little, which is what tells the member that did the work."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(ROUNDS * H * GLOBAL_BATCH, FEATURES, generator=gen)
    teacher = torch.randn(FEATURES, CLASSES, generator=gen)
    y = (x @ teacher + 1.0 * torch.randn(len(x), CLASSES, generator=gen)).argmax(1)
    return torch.utils.data.TensorDataset(x, y)


def _loss(model: Any, batch: Any) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])


def _job(rank: int, world_size: int, port: int, spec: dict[str, Any]) -> dict[str, Any]:
    import potluck
    from potluck.sync import DiLoCoSync
    from potluck.testing import join
    from potluck.trust import RoundCheck, TrustPart

    cohort = join(rank, world_size, port)
    try:
        torch.manual_seed(0)
        # (with ``norm``: batch norm and dropout, which a forward in train mode would
        # change, the running statistics and the RNG's draws)
        extra = [torch.nn.BatchNorm1d(HIDDEN), torch.nn.Dropout(0.2)] if spec["norm"] else []
        net = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), *extra, torch.nn.ReLU(),
                                  torch.nn.Linear(HIDDEN, CLASSES))
        checked: list[int] = []  # (the check's forwards: training does not call _loss)

        def counted(model: Any, batch: Any) -> torch.Tensor:
            checked.append(len(batch[0]))
            return _loss(model, batch)

        trust = potluck.Trust(round_check=RoundCheck(counted) if spec["check"] else None)
        model, opt, loader = potluck.prepare(
            net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), _data(),
            global_batch=GLOBAL_BATCH, seed=1, cohort=cohort, trust=trust,
            sync=potluck.DiLoCo(H, adaptive=False, outer_lr=0.7, outer_momentum=0.5))
        strategy = opt.part(DiLoCoSync)
        assert strategy is not None
        if spec["copy"]:  # every rank gathers the deltas; the copier sends rank 1's
            inner = strategy.round_sum

            def copying(piece: Any, group: Any) -> Any:
                rows = [torch.empty_like(piece.delta) for _ in range(group.size())]
                group.allgather([rows], [piece.delta]).wait()
                if rank == COPIER and piece.round >= COPY_FROM:
                    piece.delta.copy_(rows[COPIED_RANK])
                return inner(piece, group)

            strategy.register_round_sum(copying)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if opt.steps >= ROUNDS:
                break
        part = opt.part(TrustPart)
        assert part is not None
        return {"global": [g.clone() for g in strategy.global_parameters],
                "buffers": [b.clone() for b in net.buffers()],
                "training": [m.training for m in net.modules()],
                "quarantined": {m: [e.as_dict() for e in ev]
                                for m, ev in part.quarantined.items()},
                "events": part.events, "rng": torch.random.get_rng_state(),
                "sent": strategy.traffic.sent, "forwards": len(checked)}
    finally:
        cohort.close()


def _run(check: bool, copy: bool, norm: bool = False, world: int = 4) -> list[dict[str, Any]]:
    spec = {"check": check, "copy": copy, "norm": norm}
    return run_ranks(_job, world, free_port(), spec,  # type: ignore[no-any-return]
                     init_group=False, timeout=200)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("norm", [False, True], ids=["mlp", "batch-norm-dropout"])
def test_the_check_changes_nothing_in_a_clean_run(norm: bool) -> None:
    """Global parameters, buffers (batch norm's running statistics), the modules' modes
    and the RNG equal a run without the check, bit for bit."""
    plain, checked = _run(False, False, norm), _run(True, False, norm)
    for a, b in zip(plain, checked, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a["global"], b["global"], strict=True))
        assert all(torch.equal(x, y) for x, y in zip(a["buffers"], b["buffers"], strict=True))
        assert a["training"] == b["training"] == [True] * len(a["training"])
        assert torch.equal(a["rng"], b["rng"])
        assert b["quarantined"] == {}


@pytest.mark.timeout(400)
def test_a_copier_is_quarantined_and_the_member_it_copied_is_not() -> None:
    """Without the check both members of the pair are quarantined at the first copy
    (the values alone cannot say who copied); with it, only the copier, on every rank,
    in its first copied round, with the evidence that it copied: the shared
    pseudo-gradient fits the other member's samples, not its own (``round_copy``)."""
    from potluck.trust.verdict import COPIED

    unchecked = _run(False, True)
    assert set(unchecked[0]["quarantined"]) == {f"rank{COPIER}", f"rank{COPIED_RANK}"}
    results = _run(True, True)
    for result in results:
        assert set(result["quarantined"]) == {f"rank{COPIER}"}, result["quarantined"]
        evidence = result["quarantined"][f"rank{COPIER}"]
        assert [e["kind"] for e in evidence] == [COPIED]
        assert evidence[0]["step"] == COPY_FROM, evidence
        assert "fits the other's samples, not its own" in evidence[0]["detail"], evidence
        assert not [e for e in result["events"] if e["event"] == "suspect"], result["events"]
    assert results[1]["quarantined"] == results[0]["quarantined"]


@pytest.mark.timeout(400)
def test_a_round_of_2_runs_no_check_and_sends_no_copies_for_it() -> None:
    """Of 2 members the check can say nothing (no majority on a sample, no checker
    outside a pair), so it runs no forward and the round sends no copy for it: 2 ranks
    send what they send without it and end where they end without it. 3 ranks run it."""
    plain, checked = _run(False, False, world=2), _run(True, False, world=2)
    for a, b in zip(plain, checked, strict=True):
        assert b["forwards"] == 0 and b["sent"] == a["sent"] > 0
        assert all(torch.equal(x, y) for x, y in zip(a["global"], b["global"], strict=True))
    assert all(r["forwards"] > 0 for r in _run(True, False, world=3))
