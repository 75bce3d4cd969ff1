"""The figures of ``potluck bench straggler``, from the workers' step records (pure).

A rank's ``step`` records (``straggler_job``) carry the wall-clock ``time`` at which it
finished each step. Consecutive records make *spans*: ``(begin, end)`` of one step, the
begin being the previous step's end (loading the batch included). Throughput over
spans is samples over seconds; ``fraction_of_ideal`` divides it by the sum of every
worker's solo throughput; ``rebalance_steps`` counts the steps after a CPU-quota change
that ran below ``1 - tolerance`` of the new ideal before the run settled (``hold``
steps in a row within the tolerance).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from potluck_lab.common import finite as finite  # re-exported: JSON-safe figures

Span = tuple[float, float]  # (begin, end) of one step, wall-clock seconds
TOLERANCE, HOLD = 0.1, 2  # rebalanced: HOLD steps in a row within 10% of the new ideal


def spans(records: Iterable[Mapping[str, Any]]) -> list[Span]:
    """One span per step record but the first (whose begin is unknown), in step order."""
    ordered = sorted((int(r["step"]), float(r["time"])) for r in records
                     if r.get("kind", "step") == "step")
    return [(begin, end) for (_, begin), (_, end) in itertools.pairwise(ordered)]


def rate(steps: Sequence[Span], samples: int, *, start: float = -math.inf,
         end: float = math.inf, skip: int = 0) -> float:
    """Samples per second over the spans that lie within ``[start, end]``, leaving out
    the first ``skip`` of them; ``samples`` per step. NaN when no span is left."""
    inside = [s for s in steps if s[0] >= start and s[1] <= end][skip:]
    seconds = math.fsum(e - b for b, e in inside)
    return samples * len(inside) / seconds if inside and seconds > 0 else math.nan


def after_warmup(records: Sequence[Mapping[str, Any]], warmup: int) -> float:
    """When step ``warmup - 1`` ended: the spans from then on are the timed ones."""
    times = [float(r["time"]) for r in records if int(r["step"]) == warmup - 1]
    return times[0] if times else -math.inf


def phase_rates(records: Sequence[Sequence[Mapping[str, Any]]], samples: int,
                starts: Sequence[float], *, skip: int = 0) -> list[list[float]]:
    """Per phase (from each of ``starts`` to the next; after the first, ``skip`` spans
    more are left out): each rank's samples/s, ``records`` being each rank's."""
    ends = [*starts[1:], math.inf]
    return [[rate(spans(ranked), samples, start=start, end=end, skip=skip if i else 0)
             for ranked in records] for i, (start, end) in enumerate(zip(starts, ends,
                                                                         strict=True))]


def fraction_of_ideal(samples_per_s: float, solos: Iterable[float]) -> float:
    """Throughput over the ideal, the sum of every worker's throughput alone."""
    ideal = math.fsum(solos)
    return samples_per_s / ideal if ideal > 0 else math.nan


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def step_rates(steps: Sequence[Span], samples: int, after: float,
               until: float = math.inf) -> list[float]:
    """Samples per second of each step that ended after ``after`` (the first one was in
    flight then) and by ``until``, in order."""
    return [samples / (e - b) if e > b else math.inf for b, e in steps if after < e <= until]


def rebalance_steps(rates: Sequence[float], ideal: float, *, tolerance: float = 0.1,
                    hold: int = 2) -> int | None:
    """How many of ``rates`` (from ``step_rates``) ran below ``(1 - tolerance) * ideal``
    before ``hold`` steps in a row came within it; None if that never happened."""
    floor = (1.0 - tolerance) * ideal
    for index in range(len(rates) - hold + 1):
        if all(r >= floor for r in rates[index:index + hold]):
            return index
    return None


def change_figures(steps: Sequence[Span], samples: int, changes: Sequence[float],
                   ideals: Sequence[float], *, tolerance: float = 0.1,
                   hold: int = 2) -> dict[str, Any]:
    """After each quota change (wall-clock ``changes``): the step rates until the next,
    ``rebalance_steps`` against that quota's ideal (the larger of them is the figure;
    None if one never got there) and against the run's own pace in the second half of
    the phase (``settle``: the balancer's reaction alone, whatever the ideal)."""
    bounds = [*changes[1:], math.inf][:len(changes)]
    rates = [step_rates(steps, samples, at, until) for at, until in zip(changes, bounds,
                                                                        strict=True)]
    each = [rebalance_steps(r, ideal, tolerance=tolerance, hold=hold)
            for r, ideal in zip(rates, ideals, strict=True)]
    settle = [rebalance_steps(r, median(r[len(r) // 2:]), tolerance=tolerance, hold=hold)
              for r in rates]
    known = [x for x in each if x is not None]
    worst = max(known) if known and len(known) == len(each) else None
    return {"step_samples_per_s": rates, "rebalance_steps_each": each,
            "rebalance_steps": worst, "settle_steps_each": settle}


def time_split(records: Iterable[Mapping[str, Any]], warmup: int) -> dict[str, float]:
    """Median seconds of a rank's step parts after the warm-up (``straggler_job``: load,
    forward, backward, the wait for the all-reduce, the optimizer step with potluck's
    collectives) and CPU seconds per wall second (below 1: waiting, or throttled)."""
    timed = [r for r in records if r.get("kind", "step") == "step"
             and int(r["step"]) >= warmup and "load_s" in r]
    if not timed:
        return {}
    parts = ("load_s", "fwd_s", "bwd_s", "wait_s", "opt_s")
    split = {part: statistics.median(float(r[part]) for r in timed) for part in parts}
    wall = math.fsum(float(r[part]) for r in timed for part in parts)
    split["cpu_per_wall"] = math.fsum(float(r["cpu_s"]) for r in timed) / wall if wall else 0.0
    return split


def median(values: Iterable[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(statistics.median(finite)) if finite else math.nan


def summarize_rounds(rounds: Sequence[Mapping[str, Any]], contenders: Sequence[str],
                     workers: int) -> dict[str, Any]:
    """Medians over the rounds: each contender's samples/s, the solos and their sum (the
    ideal), and the ratios, each taken within its round (the machine's speed drifts);
    the replays on each round's solos and the balanced run over the best split's rate."""
    def each(name: str) -> list[float]:
        return [float(r[name]["samples_per_s"]) for r in rounds]

    ideals = [float(r["solo"]["ideal"]) for r in rounds]
    solos = [r["solo"]["samples_per_s"] for r in rounds]
    out: dict[str, Any] = {
        "samples_per_s": {name: median(each(name)) for name in contenders},
        "solo_samples_per_s": [median(s[rank] for s in solos) for rank in range(workers)],
        "ideal_samples_per_s": median(ideals),
        # equal shares wait for the slowest: at best workers x the slowest alone
        "ideal_vs_ddp": median(i / (workers * min(s)) for i, s in zip(ideals, solos,
                                                                       strict=True)),
    }
    fractions = ([ratio(b, i) for b, i in zip(each("balanced"), ideals, strict=True)]
                 if "balanced" in contenders else [])
    versus = ([ratio(b, d) for b, d in zip(each("balanced"), each("ddp"), strict=True)]
              if {"balanced", "ddp"} <= set(contenders) else [])
    # synchronous steps replayed on the solos' own timelines (sync_ceiling.py): the best
    # fixed split's rate and fraction of the ideal, and potluck's planner's fraction
    bests = [r["solo"].get("sync_ceiling", {}) for r in rounds]
    ceilings = [float(best.get("fraction", math.nan)) for best in bests]
    replayed = [float(best.get("planner", math.nan)) for best in bests]
    best_rates = [float(best.get("rate", math.nan)) for best in bests]
    out.update(fraction_of_ideal=median(fractions), fraction_of_ideal_rounds=fractions,
               balanced_vs_ddp=median(versus), balanced_vs_ddp_rounds=versus,
               sync_ceiling=median(ceilings), sync_ceiling_rounds=ceilings,
               planner_replay=median(replayed), planner_replay_rounds=replayed,
               fraction_of_ceiling=median(
                   ratio(b, c) for b, c in zip(each("balanced") if fractions else [],
                                               best_rates, strict=False)))
    return out


def time_rows(rounds: Sequence[Mapping[str, Any]], contenders: Sequence[str], workers: int,
              labels: Mapping[str, str]) -> list[list[Any]]:
    """Per contender and rank: samples (last step), the step's parts in ms and CPU/wall,
    medians over the rounds (``time_split``)."""
    rows: list[list[Any]] = []
    for name in contenders:
        for rank in range(workers):
            splits = [r[name]["time_split"][rank] for r in rounds]
            parts = [median(1000 * s[part] for s in splits)
                     for part in ("load_s", "fwd_s", "bwd_s", "wait_s", "opt_s")]
            rows.append([labels[name], rank, rounds[-1][name]["split"][rank], *parts,
                         median(s["cpu_per_wall"] for s in splits)])
    return rows

