"""The best a synchronous step could do on the workers' own noisy speeds (pure).

``fraction_of_ideal`` divides a job's throughput by the sum of each worker's throughput
alone. No synchronous step reaches that sum on a machine whose speed moves from step to
step, however well it splits: a step lasts as long as its slowest rank *in that step*,
and a split chosen before the step cannot know which rank the machine will slow down.

``ceiling`` measures that bound on the solo runs themselves. Each worker's solo run is
a *timeline*: its steps' spans, each doing the same number of samples at the speed the
worker had then. Synchronous steps are replayed on the timelines: every rank starts a
step at the same moment, works through its part at the speed its own timeline had at
that time, and the next step starts when the last rank is done (a rank that finished
early idles, as it would waiting in the all-reduce). Communication costs nothing here
and the split is the best fixed one in hindsight, so the result is an upper bound for
any synchronous job on that stretch of the machine's time: what is left between it and
the ideal is the machine's noise, not the planner or the wire.

``replay_policy`` replays a share policy on the same timelines instead of the best
fixed split: ``BalancerModel`` is potluck's balancer (its speed meters and planner, with
its lag), so the replay tells the planner's own loss apart from the wire's.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from typing import Protocol

from potluck.balance.balancer import BalanceConfig
from potluck.balance.planner import Plan, plan_shares
from potluck.balance.speed import SpeedMeter

Span = tuple[float, float]  # (begin, end) of one step, wall-clock seconds


class Timeline:
    """A worker's solo run: ``samples`` done in each of ``spans`` (contiguous, in order),
    at a constant speed within a span."""

    def __init__(self, spans: Sequence[Span], samples: int) -> None:
        if not spans:
            raise ValueError("a timeline needs at least one step span")
        if samples < 1:
            raise ValueError(f"samples per step must be at least 1, not {samples}")
        self._times = [spans[0][0], *(end for _, end in spans)]
        if any(later < earlier for earlier, later in itertools.pairwise(self._times)):
            raise ValueError("the spans must be in time order")
        self._samples = samples

    @property
    def begin(self) -> float:
        return self._times[0]

    @property
    def end(self) -> float:
        return self._times[-1]

    def done_by(self, time: float) -> float:
        """Samples done from the timeline's begin until ``time`` (within the timeline)."""
        time = min(max(time, self.begin), self.end)
        index = max(1, bisect.bisect_left(self._times, time))
        before, after = self._times[index - 1], self._times[index]
        within = (time - before) / (after - before) if after > before else 1.0
        return self._samples * (index - 1 + within)

    def when(self, done: float) -> float:
        """The moment ``done`` samples were reached; inf past the timeline's end."""
        if done > self._samples * (len(self._times) - 1):
            return math.inf
        steps, within = divmod(max(done, 0.0) / self._samples, 1.0)
        index = int(steps)
        if index >= len(self._times) - 1:
            return self.end
        before, after = self._times[index], self._times[index + 1]
        return before + within * (after - before)

    def rate(self, start: float, end: float) -> float:
        """Samples per second over ``[start, end]``."""
        return (self.done_by(end) - self.done_by(start)) / (end - start)


def replay(timelines: Sequence[Timeline], split: Sequence[int], start: float,
           end: float) -> float:
    """Samples per second of synchronous steps split by ``split`` (one count per
    timeline), the first starting at ``start``, over the steps that end by ``end``.
    NaN if not one step fits."""
    if len(split) != len(timelines):
        raise ValueError(f"a split of {len(split)} parts for {len(timelines)} timelines")
    now, steps = start, 0
    while True:
        finish = max(line.when(line.done_by(now) + part)
                     for line, part in zip(timelines, split, strict=True))
        if finish > end:
            break
        now, steps = finish, steps + 1
    return steps * sum(split) / (now - start) if steps else math.nan


class SplitPolicy(Protocol):
    """A share policy as a replay sees it: the split of the next step, and after each
    step what each rank took and how long its part took it."""

    def split(self) -> Sequence[int]: ...

    def measured(self, parts: Sequence[int], seconds: Sequence[float]) -> None: ...


class BalancerModel:
    """potluck's balancer on a replay: each rank's ``SpeedMeter`` and the pure
    ``plan_shares``, with the ``Balancer``'s timing: the speeds measured in a step are
    gathered after it and read after the next, so they shape the step after that."""

    def __init__(self, ranks: int, total: int, config: BalanceConfig) -> None:
        self._meters = [SpeedMeter(config.smoothing) for _ in range(ranks)]
        self._total, self._min_gain = total, config.min_gain
        self._gathered: list[list[float | None]] = []
        self._plan: Plan | None = None

    def split(self) -> Sequence[int]:
        if self._plan is not None:
            return self._plan.counts
        return _proportional([1.0] * len(self._meters), self._total)

    def measured(self, parts: Sequence[int], seconds: Sequence[float]) -> None:
        for meter, part, taken in zip(self._meters, parts, seconds, strict=True):
            meter.add(part, taken)
        self._gathered.append([meter.speed for meter in self._meters])
        if len(self._gathered) >= 2:
            speeds = self._gathered[-2]  # the gather issued after the step before
            if all(speed is not None for speed in speeds):
                self._plan = plan_shares(speeds, self._total, current=self._plan,
                                         min_gain=self._min_gain)


def window(timelines: Sequence[Timeline], start: float, end: float) -> tuple[float, float]:
    """``[start, end]`` cut to where every timeline runs (outside one, its worker's
    speed is not known); an empty window is refused."""
    start = max(start, *(line.begin for line in timelines))
    end = min(end, *(line.end for line in timelines))
    if not end > start:
        raise ValueError(f"the window [{start}, {end}] is empty (or outside a timeline)")
    return start, end


def ideal(timelines: Sequence[Timeline], start: float, end: float) -> float:
    """The sum of every timeline's samples/s over the window."""
    start, end = window(timelines, start, end)
    return math.fsum(line.rate(start, end) for line in timelines)


def replay_policy(timelines: Sequence[Timeline], policy: SplitPolicy, start: float,
                  end: float, *, warmup: int) -> float:
    """Samples per second of synchronous steps split as ``policy`` says, step by step,
    the first starting at ``start``, over the steps after the first ``warmup`` that end
    by ``end`` (the bench leaves as many out of a job's run). NaN if none is left."""
    start, end = window(timelines, start, end)
    now, steps, since, counted = start, 0, math.nan, 0
    while True:
        split = list(policy.split())
        finishes = [line.when(line.done_by(now) + part)
                    for line, part in zip(timelines, split, strict=True)]
        if max(finishes) > end:
            break
        policy.measured(split, [finish - now for finish in finishes])
        now, steps = max(finishes), steps + 1
        if steps == warmup:
            since = now
        elif steps > warmup:
            counted += sum(split)
    if warmup == 0:
        since = start
    return counted / (now - since) if counted else math.nan


def ceiling(timelines: Sequence[Timeline], slow: int, total: int, start: float,
            end: float) -> dict[str, float | list[int]]:
    """The best fixed split's synchronous samples/s over ``[start, end]`` (``rate``), the
    split, and its fraction of the ideal there (``fraction``: over the sum of every
    timeline's own samples/s). The window is cut to where every timeline runs. Searched
    over the ``slow`` rank's part; the others share the rest by their speeds over the
    window (largest remainder)."""
    if not 0 <= slow < len(timelines) or total < len(timelines):
        raise ValueError(f"slow rank {slow} of {len(timelines)} and {total} samples a step: "
                         "the slow rank must be one of them and every rank needs a sample")
    start, end = window(timelines, start, end)
    speeds = [line.rate(start, end) for line in timelines]
    best: tuple[float, list[int]] = (math.nan, [])
    others = [r for r in range(len(timelines)) if r != slow]
    for part in range(1, total - len(others) + 1):
        split = [0] * len(timelines)
        split[slow] = part
        for rank, count in zip(others, _proportional([speeds[r] for r in others],
                                                      total - part), strict=True):
            split[rank] = count
        if min(split) < 1:
            continue
        rate = replay(timelines, split, start, end)
        if not math.isnan(rate) and not rate <= best[0]:
            best = (rate, split)
    rate, split = best
    total_ideal = math.fsum(speeds)
    return {"rate": rate, "split": split,
            "fraction": rate / total_ideal if total_ideal > 0 and not math.isnan(rate)
            else math.nan}


def _proportional(weights: Sequence[float], total: int) -> list[int]:
    """``total`` split by ``weights``, largest remainder (equal when no weight)."""
    weight = math.fsum(weights)
    exact = ([total * w / weight for w in weights] if weight > 0
             else [total / len(weights)] * len(weights))
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])
    for i in order[:total - sum(counts)]:
        counts[i] += 1
    return counts
