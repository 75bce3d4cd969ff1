"""The standard DDP figures as pure functions of measured step times and latencies.

Throughput (samples/s, tokens/s), speedup over one worker on the same global batch,
scaling efficiency (speedup / N), and latency summaries (median, p95). Inputs are
plain seconds; nothing here touches a clock or a process group, so benches, training
and the demo all compute the same numbers the same way.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LatencySummary:
    """Order statistics of repeated round trips, in seconds."""

    median_s: float
    p95_s: float
    min_s: float
    count: int


@dataclass(frozen=True)
class ScalingFigures:
    """Throughput, speedup and efficiency of an N-worker run against a 1-worker baseline.

    ``speedup`` and ``efficiency`` are None when no baseline was measured.
    """

    world_size: int
    step_s: float
    samples_per_s: float
    tokens_per_s: float
    baseline_step_s: float | None
    speedup: float | None
    efficiency: float | None


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between order statistics."""
    if not values:
        raise ValueError("percentile of no values: measure at least one sample first")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must lie in [0, 100], got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(position), math.ceil(position)
    fraction = position - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def steady_state(values: Sequence[float], warmup: int) -> list[float]:
    """``values`` without the first ``warmup`` (start-up, bucket rebuild, cold caches).

    If the run was too short to drop that many, the last half is kept instead, so a
    short run still reports something rather than nothing.
    """
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0 steps, got {warmup}")
    if not values:
        raise ValueError("no step times to summarize: run at least one step")
    if len(values) > warmup:
        return list(values[warmup:])
    return list(values[len(values) // 2 :])


def throughput(items: float, seconds: float) -> float:
    """Items (samples or tokens) per second."""
    if seconds <= 0:
        raise ValueError(f"throughput needs a positive duration, got {seconds} s")
    return items / seconds


def speedup(baseline_step_s: float, step_s: float) -> float:
    """How many times faster N workers run one global step than one worker does.

    Both step times must be for the same global batch, so the ratio of step times is
    the ratio of throughputs.
    """
    if baseline_step_s <= 0 or step_s <= 0:
        raise ValueError(
            f"speedup needs positive step times, got baseline {baseline_step_s} s and "
            f"{step_s} s"
        )
    return baseline_step_s / step_s


def scaling_efficiency(speedup_: float, world_size: int) -> float:
    """Speedup divided by the number of workers: 1.0 is perfect linear scaling."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return speedup_ / world_size


def summarize_latency(samples: Sequence[float]) -> LatencySummary:
    """Median, p95 and minimum of repeated round-trip times (seconds)."""
    if not samples:
        raise ValueError("no latency samples: time at least one round trip")
    return LatencySummary(
        median_s=statistics.median(samples),
        p95_s=percentile(samples, 95.0),
        min_s=min(samples),
        count=len(samples),
    )


def scaling_figures(
    step_times: Sequence[float],
    baseline_step_times: Sequence[float] | None,
    *,
    world_size: int,
    global_batch: int,
    tokens_per_sample: int,
    warmup: int,
) -> ScalingFigures:
    """The figures of a run from its per-step times (and a 1-worker baseline's, if any).

    Step times are reduced to their steady-state median, which a few slow steps on a
    shared machine barely move.
    """
    step_s = statistics.median(steady_state(step_times, warmup))
    samples_per_s = throughput(global_batch, step_s)
    baseline_s: float | None = None
    gain: float | None = None
    efficiency: float | None = None
    if baseline_step_times:
        baseline_s = statistics.median(steady_state(baseline_step_times, warmup))
        gain = speedup(baseline_s, step_s)
        efficiency = scaling_efficiency(gain, world_size)
    return ScalingFigures(
        world_size=world_size,
        step_s=step_s,
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * tokens_per_sample,
        baseline_step_s=baseline_s,
        speedup=gain,
        efficiency=efficiency,
    )
