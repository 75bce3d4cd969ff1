"""The WAN bench's figures (pure): time to a target loss, bytes per sample, loss gap.

A curve is a list of ``[samples, wall_s, loss]`` points (the held-out loss after that
many samples; wall time without the evaluations).

- **time to target**: the wall time of the first point at or below the target loss (the
  loss torch DDP reaches after S global batches on an unlimited link). torch DDP's
  contenders are not run to the target over the slow link (hundreds of seconds each):
  their loss after a step does not depend on the link (the same ranks, data and
  arithmetic), so their time to target is the step at which their unlimited-link
  curve reaches the target times their measured step time over the slow link.
- **bytes per sample**: what both veth ends sent during the run over the samples
  trained (headers included), beside what the code counted (payload only).
- **loss gap**: the contender's loss at S global batches (the point with the same
  samples) over DDP's, minus 1.
"""

from __future__ import annotations

from collections.abc import Sequence

from potluck_lab.common import median

__all__ = ["first_at_or_below", "loss_at", "mean_gaps", "median", "ratio", "seed_gaps",
           "steps_to_target"]

Curve = Sequence[Sequence[float]]


def first_at_or_below(curve: Curve, target: float) -> Sequence[float] | None:
    """The first point whose loss is at or below ``target`` (None: never)."""
    return next((point for point in curve if point[2] <= target), None)


def steps_to_target(curve: Curve, target: float, global_batch: int) -> int | None:
    point = first_at_or_below(curve, target)
    return None if point is None else round(point[0] / global_batch)


def loss_at(curve: Curve, samples: int) -> float | None:
    """The loss of the model as it stood after ``samples``: the last evaluation at or
    before them (a round-based contender's global model changes only at its syncs, so a
    contender whose rounds do not divide ``samples`` is not credited with a round it had
    not finished); None if the curve has no point there or does not reach ``samples``."""
    if not curve or curve[-1][0] < samples:
        return None
    before = [point for point in curve if round(point[0]) <= samples]
    return before[-1][2] if before else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def seed_gaps(losses: dict[str, list[float | None]], reference: str = "ddp"
              ) -> dict[str, list[float]]:
    """Each contender's loss gap to ``reference`` (its loss over the reference's, minus
    1) seed by seed. A contender missing a seed's loss is left out."""
    base = losses[reference]
    gaps = {}
    for name, values in losses.items():
        if name == reference or len(values) != len(base) or not values:
            continue
        pairs = [(v, b) for v, b in zip(values, base, strict=True)]
        if any(v is None or b is None or b == 0 for v, b in pairs):
            continue
        gaps[name] = [v / b - 1 for v, b in pairs if v is not None and b is not None]
    return gaps


def mean_gaps(losses: dict[str, list[float | None]], reference: str = "ddp"
              ) -> dict[str, float]:
    """``seed_gaps`` averaged over the data seeds: one data order decides a run's loss
    at S batches by as much as the contenders differ."""
    return {name: sum(gaps) / len(gaps) for name, gaps in seed_gaps(losses, reference).items()}
