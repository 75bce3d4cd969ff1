"""The rounds trust bench's figures, from what its runs returned (pure).

A run's result is ``byzantine_rounds_job.run_rank``'s. Trust's events name the round
of a quarantine as ``round``, or as ``step`` (under rounds the transaction counts
rounds). A figure of the trust contender is None where trust was not available.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from potluck_lab.common import median

HURT = 1.05  # plain DiLoCo's loss ratio above this: the attack visibly hurts the mean
GOALS = {"worst_loss_ratio": 1.05, "max_rounds_to_quarantine": 3, "false_quarantines": 0,
         "clean_overhead": 0.05}


def ratio(loss: float, clean: float) -> float:
    """A final loss over the clean run's; a loss that is not finite is infinitely worse."""
    return loss / clean if math.isfinite(loss) else math.inf


def quarantines(events: Sequence[Mapping[str, Any]], rank: int) -> tuple[list[int], int]:
    """The rounds at which rank ``rank`` (member ``rank{rank}``) was quarantined, and
    how many quarantines named another member."""
    caught, others = [], 0
    for event in events:
        if event.get("event") != "quarantine":
            continue
        if event.get("member") == f"rank{rank}" or event.get("rank") == rank:
            caught.append(int(event.get("round", event.get("step", 0))))
        else:
            others += 1
    return caught, others


def any_quarantine(events: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a run quarantined anyone (on a clean run: a false quarantine)."""
    return any(event.get("event") == "quarantine" for event in events)


def rounds_to_quarantine(caught: Sequence[int], start: int) -> int | None:
    """Rounds from the attack's first corrupted round (``start``) to the first
    quarantine, that round counted as 1; None: never quarantined."""
    return min(caught) - start + 1 if caught else None


def attack_row(plain: Sequence[float], trust: Sequence[float] | None,
               caught: Sequence[int | None] | None,
               honest_quarantined: int = 0,
               trust_vs_honest: Sequence[float] | None = None) -> dict[str, Any]:
    """One attack over its seeds: loss ratios per contender (median, worst seed) and
    rounds to quarantine (the most; None if a seed never caught it). ``trust`` and
    ``caught`` are None where trust was not available. ``trust_vs_honest``: the trust
    contender's losses over a clean run of the honest members alone, per seed."""
    row: dict[str, Any] = {"plain": median(plain), "plain_by_seed": list(plain),
                           "hurts_plain": median(plain) > HURT}
    if trust is None or caught is None:
        return {**row, "trust": None, "trust_worst_seed": None, "trust_by_seed": None,
                "trust_vs_honest": None, "rounds_to_quarantine": None,
                "rounds_to_quarantine_by_seed": None,
                "honest_quarantined": None}
    found = [c for c in caught if c is not None]
    return {**row, "trust": median(trust), "trust_worst_seed": max(trust),
            "trust_by_seed": list(trust),
            "trust_vs_honest": median(trust_vs_honest) if trust_vs_honest else None,
            "rounds_to_quarantine": None if len(found) < len(caught) else max(found),
            "rounds_to_quarantine_by_seed": list(caught),
            "honest_quarantined": honest_quarantined}


def figures(attacks: Mapping[str, Mapping[str, Any]], false: int | None,
            overhead: float | None, available: bool) -> dict[str, Any]:
    """The four figures the goals are for, and the attacks that hurt plain DiLoCo.

    ``worst_loss_ratio``: the trust contender's worst attack (median over seeds);
    ``worst_loss_ratio_where_hurt``: the same over the attacks that hurt plain DiLoCo,
    the goal's scope; ``..._vs_honest``: the same against a clean run of the honest
    members alone (what the run can reach once the attacker is out).
    ``max_rounds_to_quarantine``: over every attack, infinite if one was never caught."""
    hurt = [a for a, r in attacks.items() if r["hurts_plain"]]
    out: dict[str, Any] = {"worst_loss_ratio": None, "worst_loss_ratio_where_hurt": None,
                           "worst_loss_ratio_where_hurt_vs_honest": None,
                           "max_rounds_to_quarantine": None, "false_quarantines": None,
                           "clean_overhead": None, "hurt_attacks": hurt}
    if not available:
        return out
    caught = [r["rounds_to_quarantine"] for r in attacks.values()]
    return {**out,
            "worst_loss_ratio": max((r["trust"] for r in attacks.values()), default=math.nan),
            "worst_loss_ratio_where_hurt": max((attacks[a]["trust"] for a in hurt),
                                               default=math.nan),
            "worst_loss_ratio_where_hurt_vs_honest": max(
                (v for a in hurt if (v := attacks[a].get("trust_vs_honest")) is not None),
                default=math.nan),
            "max_rounds_to_quarantine": max((math.inf if c is None else c for c in caught),
                                            default=math.nan),
            "false_quarantines": false, "clean_overhead": overhead}


def mean_round(times: Sequence[float]) -> float:
    """A run's mean round past its first (which pays for warming up)."""
    tail = times[1:] or times
    return sum(tail) / len(tail) if tail else math.nan


def overhead(trust: Sequence[float], plain: Sequence[float]) -> float:
    """The median over timing rounds of trust's mean round over plain's in the same
    timing round (they interleave), minus 1."""
    return median([t / p for t, p in zip(trust, plain, strict=True)]) - 1
