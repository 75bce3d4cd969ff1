"""The spot re-run under rounds on 4 ranks of real Gloo: ``prepare(sync=DiLoCo(...),
trust=Trust(spot_check=SpotCheck(loss, every=1)))``. An honest job is never flagged and
sends the bytes of the formula; a member that scales its update or trains on other
labels is struck by the re-run and quarantined."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from potluck.testing import free_port, join, run_ranks
from potluck.trust.round_rerun import COMMIT_BYTES, payload_bytes
from potluck.trust.round_spot import RNG_BYTES
from potluck.trust.verdict import COPIED, FREE_RIDER, NON_FINITE, REPLAYED, WRONG_STEPS

SAMPLES, GLOBAL_BATCH, ROUND, EPOCHS, CHEAT = 192, 8, 2, 1, 3


def _loss(model: Any, batch: Any) -> torch.Tensor:
    x, y = batch
    return ((model(x) - y) ** 2).mean()


class _Data(torch.utils.data.Dataset[Any]):
    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(7)
        self.x = torch.randn(SAMPLES, 8, generator=gen, dtype=torch.float64)
        self.y = self.x @ torch.randn(8, 4, generator=gen, dtype=torch.float64)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _job(rank: int, world_size: int, port: int, attack: str) -> dict[str, Any]:
    from potluck import DiLoCo, Trust, prepare
    from potluck.trust import Rules, SpotCheck
    from potluck.trust.round_part import RoundTrustPart

    cohort = join(rank, world_size, port)
    try:
        torch.manual_seed(0)
        dropout = [torch.nn.Dropout(0.2)] if attack == "honest, dropout" else []
        net = torch.nn.Sequential(torch.nn.Linear(8, 16, dtype=torch.float64), torch.nn.Tanh(),
                                  *dropout, torch.nn.Linear(16, 4, dtype=torch.float64))
        # Only the re-run strikes here: the rules on distances and norms are turned off.
        rules = Rules(far_ratio=1e9, strikes={NON_FINITE: 99, FREE_RIDER: 99, COPIED: 99,
                                              REPLAYED: 99})
        model, opt, loader = prepare(
            net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9), _Data(),
            global_batch=GLOBAL_BATCH, seed=3, cohort=cohort,
            # (honest: rounds planned by speed, in two segments; attacks: a fixed plan, so
            # the run and the picks are the same each time, and the cheat is picked)
            sync=DiLoCo(ROUND, adaptive=attack.startswith("honest"), measure=0.5),
            trust=Trust(rules=rules, spot_check=SpotCheck(_loss, every=1, steps=2)))
        cheat = rank == CHEAT and not attack.startswith("honest")
        while loader.epoch < EPOCHS:
            for x, y in loader:
                opt.zero_grad()
                if cheat and attack == "other labels":
                    y = -y
                loss = _loss(model, (x, y)) * (3.0 if cheat and attack == "scales" else 1.0)
                loss.backward()
                opt.step()
        part = opt.part(RoundTrustPart)
        assert part is not None and part.rerun is not None
        return {"checks": part.rerun.checks, "sent": part.rerun.sent_bytes,
                "events": part.events, "rounds": opt.progress.steps,
                "params": sum(p.numel() for p in net.parameters())}
    finally:
        cohort.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("attack", ["honest", "honest, dropout", "scales", "other labels"])
def test_the_spot_rerun_strikes_only_a_member_whose_first_steps_are_wrong(attack: str) -> None:
    """The re-run draws from the target's random states: with dropout an honest member's
    first steps are re-run bit for bit (with masks of each checker's own, on nanoGPT
    with dropout 0.2, every honest member was struck, one a round)."""
    results = run_ranks(_job, 4, free_port(), attack, init_group=False, timeout=160)
    first = results[0]
    checks, p = first["checks"], first["params"]
    assert checks and all(str(r["checks"]) == str(checks) for r in results)  # (NaN != NaN)
    # float64: the snapshot, and the momentum once the inner optimizer has it (round 2
    # on); the random states
    payload = {c["round"]: payload_bytes(8 * p, (8 * p if c["round"] > 1 else 0) + RNG_BYTES,
                                         False)
               for c in checks}
    assert [c["payload"] for c in checks] == [payload[c["round"]] for c in checks]
    for rank, result in enumerate(results):  # what each member sent, by the formula
        payloads = sum(len(c["checkers"]) * payload[c["round"]] for c in checks
                       if c["target"] == rank)
        assert result["sent"] == payloads + len(checks) * (COMMIT_BYTES + 8) * 3
    quarantined = [e for e in first["events"] if e["event"] == "quarantine"]
    honest = [c for c in checks if attack.startswith("honest") or c["target"] != CHEAT]
    assert all(v == 0.0 for c in honest for v in c["results"] if v == v)  # (NaN: not a checker)
    if attack.startswith("honest"):
        assert quarantined == [] and len(checks) == first["rounds"]
        return
    struck = [c for c in checks if c["target"] == CHEAT]
    assert struck, "the cheat was never picked"
    assert all(min(c["results"][k] for k in c["checkers"]) > 1e-2 for c in struck)
    assert [(e["rank"], e["evidence"][-1]["kind"]) for e in quarantined] == [(CHEAT, WRONG_STEPS)]
