"""This rank's part of a step's average, when ranks train on unequal parts.

The exact average of a global batch is ``sum over ranks of (weight_r / total) * g_r``,
where ``g_r`` is the gradient of rank r's loss averaged over its own ``weight_r`` units
(samples, or tokens when the user weights by them) and ``total`` the units of the whole
step. The step loader sets it before each step's forward; the reducer folds
``weight_r / total`` into the one pass that copies gradients into their buckets and then
only sums. When the total is not known locally (token counts), each rank contributes
``weight_r * g_r`` and the reducer divides by the summed weights, all-reduced with the
step's other end-of-step collectives. Without a contribution every rank weighs
``1 / world_size``, as in torch DDP.
"""

from __future__ import annotations

import math

from potluck.errors import ConfigError


class Contribution:
    """Set by the loader once per step: ``set(samples, weight, total)``."""

    def __init__(self) -> None:
        self.samples = 0  # samples this rank trains on in the step
        self.weight = 0.0  # its units (samples, or the user's weight such as tokens)
        self.total: float | None = None  # units of the whole step; None: summed by the reducer
        self.ready = False  # set for a step at least once


    def set(self, samples: int, weight: float, total: float | None) -> None:
        # A weight of 0 (a part of padding only) is allowed: the rank still takes part in
        # every collective. Refused on one rank alone, the others would wait for it.
        if not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
            raise ConfigError(
                f"this rank's step weight is {weight!r}: a weight (e.g. the number of real "
                "tokens in the batch) must be a finite number >= 0")
        if total is not None and not (math.isfinite(total) and total >= weight):
            raise ConfigError(f"the step's total weight {total!r} is below this rank's "
                              f"{weight!r}: the total is the whole step's, all ranks together")
        self.samples, self.weight, self.total = samples, float(weight), total
        self.ready = True

    @property
    def scale(self) -> float:
        """What this rank's averaged gradient is multiplied by before the sum."""
        return self.weight / self.total if self.total is not None else self.weight

    @property
    def needs_total(self) -> bool:
        """The total is summed across ranks after the buckets (token weights)."""
        return self.ready and self.total is None
