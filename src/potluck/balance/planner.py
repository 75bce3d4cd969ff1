"""The share planner: measured speeds in, per-rank sample counts out.

A pure function of its inputs, so every rank computes the same plan from the same
gathered speeds, bit for bit (the split itself is exact: ``data.split``). The rules:

- counts are proportional to speed, every rank at least one sample (a rank with no
  sample would skip the all-reduce the others wait for);
- a rank not yet measured (a joiner) gets a provisional speed: the mean of the measured
  ones (equal shares when nobody is measured yet);
- hysteresis: a new plan replaces the current one only if it is predicted to make the
  step at least ``min_gain`` faster (a step takes as long as its slowest rank:
  ``max(count / speed)``), so measurement noise does not move samples back and forth;
- a rank whose count exceeds its memory cap (``max_micro_batch``) trains on it in
  ``ceil(count / cap)`` micro-batches with accumulation; the count is not limited.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from potluck.data.split import split_counts
from potluck.errors import ConfigError

_TINY = 1e-12  # stands in for a zero speed in time predictions


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
                min_gain: float = 0.05) -> Plan:
    """The plan for ranks with ``speeds`` (samples/s, None: not measured yet)."""
    world_size = _check(speeds, global_batch, caps, min_gain)
    filled = _provisional(speeds)
    counts = _proportional(filled, global_batch)
    if (current is not None and current.world_size == world_size
            and sum(current.counts) == global_batch
            and current.step_time(filled) <= Plan(counts, counts).step_time(filled)
            * (1.0 + min_gain)):
        counts = current.counts  # not worth moving samples
    return Plan(counts, _micro_batches(counts, caps))


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
