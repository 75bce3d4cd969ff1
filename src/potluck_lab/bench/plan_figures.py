"""The figures of ``potluck bench plan`` (pure): a run's steady rate, the machines the
planner is told about, and how far its predictions fall from the measured runs."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from potluck.plan import Machine

UNLIMITED_BPS = 1e11  # a link with no cap, as the planner sees it


@dataclass(frozen=True)
class ComputeLine:
    """Seconds of a local step of ``b`` samples under a quota of ``quota`` of a core:
    ``(fixed_s + b / per_s) * quota_ref / quota`` (a CPU quota scales it inversely)."""

    fixed_s: float
    per_s: float  # samples a second beyond the fixed part
    quota_ref: float

    def speed(self, batch: float, quota: float) -> float:
        return batch / ((self.fixed_s + batch / self.per_s) * self.quota_ref / quota)


def fit_line(batches: Sequence[int], seconds: Sequence[float], quota: float) -> ComputeLine:
    """The line through two (batch, step seconds) points measured at ``quota``."""
    (b0, b1), (t0, t1) = batches, seconds
    per = (b1 - b0) / max(t1 - t0, 1e-9)
    return ComputeLine(max(0.0, t0 - b0 / per), per, quota)


def steady_rate(commits: Sequence[Sequence[float]], skip: int) -> float:
    """Samples a second from commit ``skip`` to the last (the first ones warm up)."""
    tail = commits[skip:]
    if len(tail) < 2:
        raise ValueError(f"steady_rate: {len(commits)} commits leave too few after {skip}")
    return sum(c[1] for c in tail[1:]) / (tail[-1][0] - tail[0][0])


def machine(name: str, speed: float, bps: float | None) -> Machine:
    rate = UNLIMITED_BPS if bps is None else bps
    return Machine(name, speed, rate, rate)


def error(predicted: float, measured: float) -> float:
    """The prediction's error as a fraction of the measured figure."""
    return (predicted - measured) / measured


def summary(errors: Sequence[float]) -> dict[str, float]:
    absolute = [abs(e) for e in errors]
    return {"median_abs_error": statistics.median(absolute) if absolute else float("nan"),
            "max_abs_error": max(absolute, default=float("nan"))}
