"""One rank of the rounds trust bench: 4 workers under DiLoCo, one of them attacking
(``byzantine_rounds.py``).

The model, the data and the attacker's rank are the every-step bench's
(``byzantine_job``). The attack wraps the round sum in place on every rank, so with
trust it wraps trust's robust round sum. Where ``prepare`` refuses trust with rounds,
every rank returns why (``unavailable``) and trains nothing.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from potluck_lab.bench.byzantine_job import (
    ATTACKER,
    CLASSES,
    GLOBAL_BATCH,
    data,
    join,
    model,
    spot_loss,
)
from potluck_lab.round_attacks import RoundAttack, first_round, other_labels

INNER_LR = 0.05  # the inner SGD's, with momentum 0.9 (the every-step bench's optimizer)
# DiLoCo's outer Nesterov SGD. The paper's momentum (0.9) made this task's clean loss
# swing between 0.4 and 2.1 over 16 rounds of 8 steps; with 0.5 it falls steadily.
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.5


def refuses_trust(message: str) -> bool:
    """Whether a ``ConfigError`` is ``prepare``'s refusal of trust with rounds."""
    return "trust" in message and "DiLoCo" in message


def run_rank(rank: int, world_size: int, port: int, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec``: attack (a name or "none"), trust (bool), seed, rounds, inner_steps (H),
    wrap (bool: put the attack wrapper in even with no attack; False for the timing
    runs), floor (bool, optional: one all-gather of the pseudo-gradient more a round)."""
    import logging

    import potluck
    from potluck.sync import DiLoCoSync

    logging.getLogger("potluck").setLevel(logging.ERROR)  # the figures say what happened
    cohort = join(rank, world_size, port)
    rounds, inner_steps = spec["rounds"], spec["inner_steps"]
    train, (hx, hy) = data(rounds * inner_steps)
    net = model(spec["seed"])
    optimizer = torch.optim.SGD(net.parameters(), lr=INNER_LR, momentum=0.9)
    # Equal shares (adaptive=False): every member's delta is H local steps of the same size.
    sync = potluck.DiLoCo(inner_steps=inner_steps, adaptive=False, outer_lr=OUTER_LR,
                          outer_momentum=OUTER_MOMENTUM)
    try:
        wrapped, opt, loader = potluck.prepare(
            net, optimizer, train, global_batch=GLOBAL_BATCH, seed=spec["seed"],
            cohort=cohort, sync=sync, trust=_trust() if spec["trust"] else None)
    except potluck.ConfigError as exc:
        if not refuses_trust(str(exc)):
            raise
        cohort.close()
        return {"unavailable": str(exc)}
    strategy = opt.part(DiLoCoSync)
    assert strategy is not None
    attacker = rank == ATTACKER
    if spec["wrap"]:
        strategy.register_round_sum(RoundAttack(strategy.round_sum, spec["attack"], attacker,
                                                seed=spec["seed"]))
    if spec.get("floor"):
        strategy.register_round_sum(_with_all_gather(strategy.round_sum))
    relabel = attacker and spec["attack"] == "other_data"
    loss_fn = nn.CrossEntropyLoss()
    times: list[float] = []
    began = time.perf_counter()
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(wrapped(xb), other_labels(yb, CLASSES) if relabel else yb).backward()
        before = opt.steps
        opt.step()
        if opt.steps == before:
            continue
        now = time.perf_counter()
        times.append(now - began)
        began = now
        if opt.steps >= rounds:
            break
    with torch.no_grad():
        final = float(loss_fn(net(hx), hy))
    events = _trust_events(opt)
    opt.finish()
    return {"loss": final, "round_times": times, "events": events, "rounds": len(times),
            "skipped": strategy.skipped, "start": first_round(spec["attack"]),
            "unavailable": None}


def _with_all_gather(inner: Any) -> Any:
    """``inner``, after one all-gather of the piece's pseudo-gradient: the raw cost of
    one more collective of a round, the floor of what any check that moves the
    pseudo-gradients again costs (the timing's third contender)."""

    def summed(piece: Any, group: Any) -> Any:
        rows = [torch.empty_like(piece.delta) for _ in range(group.size())]
        group.allgather([rows], [piece.delta]).wait()
        return inner(piece, group)

    return summed


def _trust() -> Any:
    """Trust with the work check of every member every round."""
    import potluck.trust

    return potluck.Trust(round_check=potluck.trust.RoundCheck(spot_loss))


def _trust_events(opt: Any) -> list[dict[str, Any]]:
    """Trust's quarantines and repairs; none where no trust part is there. The part is
    ``TrustPart`` or, under rounds, whichever part is named "trust" (the rounds' part
    need not be a ``TrustPart``)."""
    import potluck.trust

    part = opt.part(potluck.trust.TrustPart)
    if part is None:
        part = next((p for p in opt.parts if getattr(p, "name", None) == "trust"), None)
    return list(getattr(part, "events", None) or [])
