"""The share planner: measured speeds in, per-rank sample counts out.

A pure function of its inputs, so every rank computes the same plan from the same
gathered speeds, bit for bit (the split itself is exact: ``data.split``). The rules:

- counts are proportional to speed, every rank at least one sample (a rank with no
  sample would skip the all-reduce the others wait for);
- a rank not yet measured (a joiner) gets a provisional speed: the mean of the measured
  ones (equal shares when nobody is measured yet);
- hysteresis: a new plan replaces the current one only if it is predicted to make the
  step at least ``min_gain`` faster (a step takes as long as its slowest rank:
  ``max(count / speed)``) and, given each speed's uncertainty (``noise``), the speeds
  differ from what the current plan assumes by more than their noise: for some pair
  of ranks the ratio of speeds lies more than ``CONFIDENCE`` standard errors from the
  ratio of their counts (beyond the rounding of whole samples);
- ``replan`` is one gather's decision in a running job: it takes a new plan only
  when ``CONFIRM`` gathers in a row call for one, so a slow step or two (which a meter
  cannot yet tell from a new speed) do not move samples there and back;
- a rank whose count exceeds its memory cap (``max_micro_batch``) trains on it in
  ``ceil(count / cap)`` micro-batches with accumulation; the count is not limited.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from potluck.data.split import split_counts
from potluck.errors import ConfigError

_TINY = 1e-12  # stands in for a zero speed in time predictions
# Standard errors by which a speed ratio must leave its plan's before samples follow.
CONFIDENCE = 3.0
# Gathers in a row that must call for a new plan before it is taken.
CONFIRM = 2


@dataclass(frozen=True)
class Plan:
    """Samples per rank of a full global batch, and how many micro-batches each takes."""

    counts: tuple[int, ...]
    micro_batches: tuple[int, ...]

    @property
    def world_size(self) -> int:
        return len(self.counts)

    def step_time(self, speeds: Sequence[float]) -> float:
        """Predicted seconds of compute for the step: its slowest rank's."""
        return max(count / max(speed, _TINY) for count, speed in zip(self.counts, speeds,
                                                                       strict=True))


def plan_shares(speeds: Sequence[float | None], global_batch: int, *,
                caps: Sequence[int | None] | None = None, current: Plan | None = None,
                min_gain: float = 0.05,
                noise: Sequence[float | None] | None = None) -> Plan:
    """The plan for ranks with ``speeds`` (samples/s, None: not measured yet);
    ``noise``: each speed's relative standard error (``SpeedMeter.uncertainty``; None
    for a rank: unknown; no ``noise``: speeds taken as exact)."""
    world_size = _check(speeds, global_batch, caps, min_gain)
    _check_noise(noise, world_size)
    filled = _provisional(speeds)
    counts = _proportional(filled, global_batch)
    if (current is not None and current.world_size == world_size
            and sum(current.counts) == global_batch
            and (current.step_time(filled) <= Plan(counts, counts).step_time(filled)
                 * (1.0 + min_gain)
                 or (noise is not None
                     and _evidence(speeds, noise, current.counts) <= CONFIDENCE))):
        counts = current.counts  # not worth moving samples, or no sure gain
    return Plan(counts, _micro_batches(counts, caps))


def replan(speeds: Sequence[float | None], global_batch: int, *, current: Plan | None,
           calls: int, noise: Sequence[float | None],
           caps: Sequence[int | None] | None = None,
           min_gain: float = 0.05) -> tuple[Plan, int]:
    """One gather's decision in a running job: the plan from now on, and how many
    gathers in a row have called for a move (pass it back as ``calls`` next time; 0 at
    the start). ``current`` None (or of another world size) means equal shares."""
    world_size = _check(speeds, global_batch, caps, min_gain)
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
        raise ConfigError(f"calls={calls!r} is invalid: it is the count of gathers in a "
                          "row that called for a new plan, an integer >= 0 (0 at the start)")
    if current is None or current.world_size != world_size \
            or sum(current.counts) != global_batch:
        equal = _proportional([1.0] * world_size, global_batch)
        current = Plan(equal, _micro_batches(equal, caps))
    proposal = plan_shares(speeds, global_batch, caps=caps, current=current,
                           min_gain=min_gain, noise=noise)
    if proposal.counts == current.counts:
        return proposal, 0
    if calls + 1 < CONFIRM:
        return Plan(current.counts, _micro_batches(current.counts, caps)), calls + 1
    return proposal, 0


def _evidence(speeds: Sequence[float | None], noise: Sequence[float | None],
              counts: Sequence[int]) -> float:
    """How far the measured speeds are from fitting the plan ``counts``, in standard
    errors: over pairs of ranks with a speed and a noise, the largest distance between
    their speed ratio and their count ratio (logs), less half a sample of rounding on
    each count. 0 with fewer than two such ranks."""
    known = [(math.log(max(speed, _TINY) / count), error, 0.5 / count)
             for speed, error, count in zip(speeds, noise, counts, strict=True)
             if speed is not None and error is not None]
    largest = 0.0
    for (a, error_a, rounding_a), (b, error_b, rounding_b) in itertools.combinations(known, 2):
        beyond = abs(a - b) - rounding_a - rounding_b
        error = math.hypot(error_a, error_b)
        if beyond > 0:
            largest = max(largest, beyond / error if error > 0 else math.inf)
    return largest


def _provisional(speeds: Sequence[float | None]) -> list[float]:
    measured = [s for s in speeds if s is not None]
    stand_in = math.fsum(measured) / len(measured) if measured else 1.0
    return [stand_in if s is None else s for s in speeds]


def _proportional(speeds: Sequence[float], global_batch: int) -> tuple[int, ...]:
    """In proportion to speed (largest remainder); a rank left with none takes one
    sample from the rank with the most (the lowest such rank on a tie)."""
    weights = speeds if any(s > 0 for s in speeds) else [1.0] * len(speeds)
    counts = split_counts(global_batch, weights)
    for rank, count in enumerate(counts):
        if count == 0:
            richest = counts.index(max(counts))
            counts[richest] -= 1
            counts[rank] = 1
    return tuple(counts)


def _micro_batches(counts: Sequence[int], caps: Sequence[int | None] | None) -> tuple[int, ...]:
    if caps is None:
        return (1,) * len(counts)
    return tuple(1 if cap is None else -(-count // cap) for count, cap in zip(counts, caps,
                                                                             strict=True))


def _check_noise(noise: Sequence[float | None] | None, world_size: int) -> None:
    if noise is None:
        return
    if len(noise) != world_size:
        raise ConfigError(f"noise has {len(noise)} entries for {world_size} ranks: give one "
                          "relative standard error (or None) per rank")
    for rank, error in enumerate(noise):
        if error is not None and (isinstance(error, bool) or not isinstance(error, (int, float))
                                  or not math.isfinite(error) or error < 0):
            raise ConfigError(
                f"noise[{rank}]={error!r} is invalid: a speed's relative standard error is "
                "a finite number >= 0 (e.g. 0.05), or None where it is not known")


def _check(speeds: Sequence[float | None], global_batch: int,
           caps: Sequence[int | None] | None, min_gain: float) -> int:
    world_size = len(speeds)
    if world_size == 0:
        raise ConfigError("speeds=[] is invalid: give one speed (samples/s, or None if "
                          "not measured yet) per rank")
    for rank, speed in enumerate(speeds):
        if speed is not None and (isinstance(speed, bool) or not isinstance(speed, (int, float))
                                  or not math.isfinite(speed) or speed < 0):
            raise ConfigError(
                f"speeds[{rank}]={speed!r} is invalid: a speed is a finite number of "
                "samples per second >= 0, or None for a rank not measured yet")
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) \
            or global_batch < world_size:
        raise ConfigError(
            f"global_batch={global_batch!r} is invalid for {world_size} rank(s): every "
            f"rank needs at least one sample per step, so it must be an integer >= "
            f"{world_size}; raise the global batch or run fewer workers")
    if caps is not None:
        if len(caps) != world_size:
            raise ConfigError(f"caps has {len(caps)} entries for {world_size} ranks: give "
                              "one max_micro_batch (or None) per rank")
        for rank, cap in enumerate(caps):
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int)
                                    or cap < 1):
                raise ConfigError(
                    f"caps[{rank}]={cap!r} is invalid: max_micro_batch is the most "
                    "samples one forward may take on that rank, an integer >= 1 (or None)")
    if not isinstance(min_gain, (int, float)) or not 0.0 <= min_gain < 1.0:
        raise ConfigError(f"min_gain={min_gain!r} is invalid: it is the least predicted "
                          "step-time gain worth a new plan, a fraction in [0, 1), e.g. 0.05")
    return world_size
