"""The best fixed split's synchronous rate on the workers' own noisy speeds (pure).

``fraction_of_ideal`` divides a job's throughput by the sum of each worker's throughput
alone. A synchronous step does not reach that sum on a machine whose speed moves from
step to step, however well it splits: a step lasts as long as its slowest rank *in
that step*, and a split chosen before the step cannot know which rank the machine will
slow down.

``ceiling`` estimates that loss on the solo runs themselves. Each worker's solo run is
a *timeline*: its steps' spans, each doing the same number of samples at the speed the
worker had then (time taken as proportional to samples, so a step's fixed costs are
spread over its samples). Synchronous steps are replayed on the timelines: every rank
starts a step at the same moment, works through its part at the speed its own timeline
had at that time, and the next step starts when the last rank is done (a rank that
finished early idles, as it would waiting in the all-reduce). Communication costs
nothing and the split is the best fixed one in hindsight (searched over the slow
rank's part, the others sharing the rest by their speeds: for more than two workers a
one-parameter family). It is an estimate, not a bound: it is taken on the solo run's
stretch of the machine's time, not the job's, and a split that adapts can beat the
best fixed one when the speeds drift within the window.

``replay_policy`` replays a share policy on the same timelines instead:
``BalancerModel`` is potluck's balancer (its speed meters and planner, with its lag),
so the planner's own loss can be told apart from the wire's.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from potluck.balance.balancer import BalanceConfig
from potluck.balance.planner import Plan, replan
from potluck.balance.speed import SpeedMeter
from potluck.data.split import equal_shares, split_counts
from potluck_lab.bench.straggler_figures import Span


class Timeline:
    """A worker's solo run: ``samples`` done in each of ``spans`` (contiguous, in order),
    at a constant speed within a span."""

    def __init__(self, spans: Sequence[Span], samples: int) -> None:
        if not spans:
            raise ValueError("a timeline needs at least one step span")
        if samples < 1:
            raise ValueError(f"samples per step must be at least 1, not {samples}")
        self._times = [spans[0][0], *(end for _, end in spans)]
        for index, (earlier, later) in enumerate(itertools.pairwise(self._times)):
            if later < earlier:
                raise ValueError(f"span {index} ends at {later} before it begins at "
                                 f"{earlier}: the spans must be contiguous, in time order")
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


@dataclass(frozen=True)
class Replayed:
    """``samples`` done by the replayed steps counted, from ``start`` to ``end``."""

    samples: int
    start: float
    end: float

    @property
    def rate(self) -> float:
        """Samples per second; NaN when no step was counted."""
        return self.samples / (self.end - self.start) if self.end > self.start else math.nan


def replay(timelines: Sequence[Timeline], split: Sequence[int], start: float,
           end: float) -> Replayed:
    """Synchronous steps split by ``split`` (one count per timeline, each at least 1),
    the first starting at ``start``: the steps that end by ``end``."""
    if len(split) != len(timelines):
        raise ValueError(f"a split of {len(split)} parts for {len(timelines)} timelines")
    if min(split) < 1:
        raise ValueError(f"split {list(split)}: every rank needs at least one sample a step")
    now, steps = start, 0
    while True:
        finish = max(line.when(line.done_by(now) + part)
                     for line, part in zip(timelines, split, strict=True))
        if finish > end:
            break
        now, steps = finish, steps + 1
    return Replayed(steps * sum(split), start, now)


class SplitPolicy(Protocol):
    """A share policy as a replay sees it: the split of the next step, and after each
    step what each rank took and how long its part took it."""

    def split(self) -> Sequence[int]: ...

    def measured(self, parts: Sequence[int], seconds: Sequence[float]) -> None: ...


class BalancerModel:
    """potluck's balancer on a replay: each rank's ``SpeedMeter`` and the pure
    ``replan``, with the ``Balancer``'s timing: the speeds measured in a step are
    gathered after it and read after the next, so they shape the step after that (the
    first gather, before any speed is measured, plans equal shares, as there). A model,
    not the balancer: its meters are fed a part's whole time on the timeline (load and
    optimizer step included, not the ``ComputeClock``'s), and it has no memory caps."""

    def __init__(self, ranks: int, total: int, config: BalanceConfig) -> None:
        if ranks < 1 or total < ranks:
            raise ValueError(f"{ranks} rank(s) and {total} samples a step: every rank "
                             "needs at least one sample")
        self._meters = [SpeedMeter(config.smoothing) for _ in range(ranks)]
        self._total, self._min_gain = total, config.min_gain
        self._gathered: list[tuple[list[float | None], list[float | None]]] = []
        self._plan: Plan | None = None
        self._calls = 0

    def split(self) -> Sequence[int]:
        if self._plan is not None:
            return self._plan.counts
        return split_counts(self._total, equal_shares(len(self._meters)))

    def measured(self, parts: Sequence[int], seconds: Sequence[float]) -> None:
        for meter, part, taken in zip(self._meters, parts, seconds, strict=True):
            meter.add(part, taken)
        self._gathered.append(([meter.speed for meter in self._meters],
                               [meter.uncertainty for meter in self._meters]))
        if len(self._gathered) >= 2:  # the gather issued after the step before
            speeds, noise = self._gathered[-2]
            self._plan, self._calls = replan(speeds, self._total, current=self._plan,
                                             calls=self._calls, noise=noise,
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


def fraction(timelines: Sequence[Timeline], replayed: Replayed) -> float:
    """A replay's rate over the ideal of the same stretch of time; NaN if empty."""
    if not replayed.end > replayed.start:
        return math.nan
    return replayed.rate / ideal(timelines, replayed.start, replayed.end)


def replay_policy(timelines: Sequence[Timeline], policy: SplitPolicy, start: float,
                  end: float, *, warmup: int) -> Replayed:
    """Synchronous steps split as ``policy`` says, step by step, the first starting at
    ``start``: the steps that end by ``end`` after the first ``warmup`` (counted from
    the end of step ``warmup``, as the bench measures a job's run)."""
    if warmup < 0:
        raise ValueError(f"warmup={warmup}: give the number of first steps to leave out, "
                         ">= 0")
    start, end = window(timelines, start, end)
    now, steps, since, counted = start, 0, start, 0
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
    return Replayed(counted, since, now if counted else since)


def ceiling(timelines: Sequence[Timeline], slow: int, total: int, start: float,
            end: float) -> dict[str, float | list[int]]:
    """The best fixed split's synchronous samples/s over ``[start, end]`` (``rate``),
    the split, and its fraction of the ideal of the same stretch (``fraction``). The
    window is cut to where every timeline runs. Searched over the ``slow`` rank's part;
    the others share the rest by their speeds over the window."""
    if len(timelines) < 2 or not 0 <= slow < len(timelines) or total < len(timelines):
        raise ValueError(f"slow rank {slow} of {len(timelines)} and {total} samples a step: "
                         "give at least two timelines, the slow rank one of them, and at "
                         "least one sample a rank")
    start, end = window(timelines, start, end)
    speeds = [line.rate(start, end) for line in timelines]
    others = [r for r in range(len(timelines)) if r != slow]
    rest = [speeds[r] for r in others]
    best: tuple[float, float, list[int]] = (math.nan, math.nan, [])
    for part in range(1, total - len(others) + 1):
        split = [0] * len(timelines)
        split[slow] = part
        counts = split_counts(total - part, rest if any(rest) else equal_shares(len(rest)))
        for rank, count in zip(others, counts, strict=True):
            split[rank] = count
        if min(split) < 1:
            continue
        replayed = replay(timelines, split, start, end)
        share = fraction(timelines, replayed)
        if not math.isnan(share) and not share <= best[1]:
            best = (replayed.rate, share, split)
    rate, share, split = best
    return {"rate": rate, "split": split, "fraction": share}
