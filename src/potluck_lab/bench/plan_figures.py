"""The figures of ``potluck bench plan`` (pure): a run's steady rate, the machines the
planner is told about, and how far its predictions fall from the measured runs."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from potluck.plan import Machine

UNLIMITED_BPS = 1e11  # a link with no cap, as the planner sees it


@dataclass(frozen=True)
class Compute:
    """Seconds of one worker's local step, measured alone at each batch size it takes,
    under ``quota_ref`` of a core. A step's seconds follow a line in its batch (a fixed
    part and a part per sample), fitted by least squares over the sizes measured, so
    one noisy run weighs a third or a quarter. A CPU quota ``q`` scales them by
    ``quota_ref / q`` (a busy single thread gets its quota's share of the CPU)."""

    seconds: dict[int, float]
    quota_ref: float

    def step_s(self, batch: float) -> float:
        if len(self.seconds) < 2:
            return next(iter(self.seconds.values())) * batch / next(iter(self.seconds))
        xs, ys = list(self.seconds), list(self.seconds.values())
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        per = (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
               / sum((x - mx) ** 2 for x in xs))
        return my + per * (batch - mx)

    def speed(self, batch: float, quota: float) -> float:
        return batch / (self.step_s(batch) * self.quota_ref / quota)


def steady_rate(commits: Sequence[Sequence[float]], skip: int) -> float:
    """Samples a second from commit ``skip`` to the last (the first ones warm up)."""
    tail = commits[skip:]
    if len(tail) < 2:
        raise ValueError(f"steady_rate: {len(commits)} commits leave too few after {skip}")
    return sum(c[1] for c in tail[1:]) / (tail[-1][0] - tail[0][0])


def round_parts(ranks: Sequence[Sequence[Sequence[float]]], skip: int) -> dict[str, float]:
    """Where a DiLoCo run's steady rounds went, from each rank's rounds (compute, wait,
    sync seconds): the median over rounds past ``skip`` of the slowest rank's local
    compute, and of the ranks' median sync (the pseudo-gradients' sum, the outer step).
    Empty without a steady round on every rank."""
    count = min((len(r) for r in ranks), default=0)
    steady = range(skip, count)
    if not ranks or not steady:
        return {}
    return {"compute_s": statistics.median(max(r[i][0] for r in ranks) for i in steady),
            "sync_s": statistics.median(statistics.median(r[i][2] for r in ranks)
                                        for i in steady)}


def machine(name: str, speed: float, bps: float | None, cores: float | None = None) -> Machine:
    """A bench worker: ``cores`` is its CPU quota, which its compute runs on."""
    rate = UNLIMITED_BPS if bps is None else bps
    return Machine(name, speed, rate, rate, cores=cores)


def error(predicted: float, measured: float) -> float:
    """The prediction's error as a fraction of the measured figure."""
    return (predicted - measured) / measured


def summary(errors: Sequence[float]) -> dict[str, float]:
    absolute = [abs(e) for e in errors]
    return {"median_abs_error": statistics.median(absolute) if absolute else float("nan"),
            "max_abs_error": max(absolute, default=float("nan"))}
