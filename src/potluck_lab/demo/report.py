"""Text the demo prints: the figures table, the loss line, the generated sample.

Pure formatting of numbers already measured; nothing here times or trains anything.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from potluck.metrics.figures import (
    LatencySummary,
    ScalingFigures,
    steady_state,
    summarize_latency,
)
from potluck.metrics.latency import RoundTrips

# Steps after the warm-up each phase needs before its median step time means something.
MIN_TIMED_STEPS = 10


@dataclass(frozen=True)
class SyncLatency:
    """Round trips measured in the workers after training; None with one worker."""

    barrier: LatencySummary | None
    allreduce: LatencySummary | None
    allreduce_bytes: int
    step_sync_s: float | None  # median per-step gradient sync span (overlaps backward)


def sync_latency(
    trips: RoundTrips | None, step_sync_s: Sequence[float], warmup: int
) -> SyncLatency:
    """Summaries of the workers' round trips and per-step sync spans (None if not measured)."""
    if trips is None or not trips.barrier_s or not trips.allreduce_s:
        return SyncLatency(None, None, 0, None)
    return SyncLatency(
        barrier=summarize_latency(trips.barrier_s),
        allreduce=summarize_latency(trips.allreduce_s),
        allreduce_bytes=trips.allreduce_bytes,
        step_sync_s=statistics.median(steady_state(step_sync_s, warmup)) if step_sync_s else None,
    )


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain left-aligned table with a rule under the header."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = (cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        return "  ".join(padded).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def too_short_to_compare(steps: int, baseline_steps: int, warmup: int) -> str | None:
    """Why the speedup of phases of ``steps`` and ``baseline_steps`` steps is not worth
    printing (None: it is). Each phase needs ``MIN_TIMED_STEPS`` steps after its
    ``warmup``: a median of a few steps is mostly the machine's noise."""
    timed = min(steps, baseline_steps) - warmup
    if timed >= MIN_TIMED_STEPS:
        return None
    return (f"too short to measure: {max(timed, 0)} step(s) after the {warmup}-step warm-up "
            f"in the shorter phase, {MIN_TIMED_STEPS} needed; run potluck demo with "
            f"--steps and --baseline-steps of {warmup + MIN_TIMED_STEPS} or more")


def figures_table(figures: ScalingFigures, sync: SyncLatency, baseline_note: str, *,
                  too_short: str | None = None) -> str:
    """The four standard DDP figures: throughput, speedup, efficiency, sync latency.
    ``too_short``: why the speedup is not shown (``too_short_to_compare``)."""
    n = figures.world_size
    efficiency = ("n/a" if figures.efficiency is None or too_short is not None
                  else f"{figures.efficiency:.0%}")
    rows = [
        [
            "throughput",
            f"{figures.samples_per_s:,.1f} samples/s, {figures.tokens_per_s:,.0f} tokens/s",
            f"global batch / median step time ({_ms(figures.step_s)} with {_workers(n)})",
        ],
        _speedup_row(figures, baseline_note, too_short),
        ["scaling efficiency", efficiency, f"speedup / {_workers(n)} (100% = linear)"],
        *_latency_rows(sync),
    ]
    return format_table(["figure", "value", "how it was measured"], rows)


def _speedup_row(figures: ScalingFigures, baseline_note: str,
                 too_short: str | None) -> list[str]:
    if figures.speedup is None or figures.baseline_step_s is None:
        return ["speedup vs 1 worker", "n/a", baseline_note]
    if too_short is not None:
        return ["speedup vs 1 worker", "n/a", too_short]
    return [
        "speedup vs 1 worker",
        f"{figures.speedup:.2f}x",
        f"1-worker step {_ms(figures.baseline_step_s)} / {figures.world_size}-worker step "
        f"{_ms(figures.step_s)}, same global batch, same run",
    ]


def _latency_rows(sync: SyncLatency) -> list[list[str]]:
    if sync.barrier is None or sync.allreduce is None:
        return [["sync latency", "n/a", "one worker: nothing to synchronize"]]
    rows = [
        [
            "sync latency: barrier",
            _ms(sync.barrier.median_s),
            f"median of {sync.barrier.count} round trips (p95 {_ms(sync.barrier.p95_s)})",
        ],
        [
            "sync latency: all-reduce",
            _ms(sync.allreduce.median_s),
            f"median of {sync.allreduce.count} all-reduces of the gradient size "
            f"({sync.allreduce_bytes / 1e6:.1f} MB, p95 {_ms(sync.allreduce.p95_s)})",
        ],
    ]
    if sync.step_sync_s is not None:
        rows.append([
            "gradient sync per step",
            _ms(sync.step_sync_s),
            "median first-bucket launch to last-bucket done (overlaps backward)",
        ])
    return rows


def loss_summary(losses: Sequence[float], tail: int = 20, first_step: int = 0) -> str:
    """First and last loss, plus the mean of the last ``tail`` steps (less noisy)."""
    if not losses:
        return "loss: no steps were run"
    tail_losses = losses[-tail:]
    last_step = first_step + len(losses) - 1
    return (
        f"loss: {losses[0]:.3f} at step {first_step} -> {losses[-1]:.3f} at step {last_step} "
        f"(mean of the last {len(tail_losses)} steps: {statistics.fmean(tail_losses):.3f})"
    )


def equivalence_line(
    losses: Sequence[float], baseline_losses: Sequence[float], world_size: int
) -> str:
    """How closely the 1-worker phase reproduced the N-worker run's first losses.

    Both phases start from the same weights and train on the same global batches, so
    with correct gradient averaging the losses agree up to float rounding.
    """
    steps = min(len(losses), len(baseline_losses))
    if steps == 0:
        return "check: no steps to compare between the 1-worker and N-worker phases"
    diff = max(abs(a - b) for a, b in zip(losses[:steps], baseline_losses[:steps], strict=True))
    return (
        f"check: over the first {steps} steps, 1 worker and {_workers(world_size)} "
        f"computed the same losses to within {diff:.1e} (same weights, same global batches)"
    )


def sample_block(sample: str, prompt: str) -> str:
    """The generated text, indented, with the prompt named."""
    body = "\n".join("    " + line for line in sample.splitlines())
    return f"generated text (rank 0, prompt {prompt!r}):\n{body}"


def _workers(n: int) -> str:
    return "1 worker" if n == 1 else f"{n} workers"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 0.01 else f"{seconds * 1e3:.1f} ms"
