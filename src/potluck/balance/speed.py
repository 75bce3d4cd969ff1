"""One worker's own compute speed, smoothed.

A worker's step time says nothing about its speed: the all-reduce makes every rank wait
for the slowest, so step times are equal by construction. What is measured instead is
local: the seconds from the step's first forward until this rank's last gradient is
ready (``clock.ComputeClock``), per sample. The meter keeps an exponential moving
average of seconds per sample (averaging times, not speeds, so one slow outlier is not
drowned by fast ones), bias-corrected as Adam corrects its moments, so the first
measurement counts in full instead of being pulled towards zero. A step more than
``jump`` times slower or faster than the average restarts it from that step: a GPU
whose owner starts a game is a new worker, not noise to be averaged away over several
steps. The meter also keeps the *spread* of single steps (how far one step's time per
sample typically lies from the average, in log terms) and from it the *uncertainty* of
the speed: the planner moves samples only for differences beyond it. Pure: no clock,
no I/O.
"""

from __future__ import annotations

import math
from typing import Any

from potluck.errors import ConfigError

# Until steps are measured, one step is taken to lie about 10% from the average.
PRIOR_SPREAD = 0.1
# The spread's own average weighs the past 0.8 a step: a lone slow step (a burst of
# other work on the machine) widens it at once, by about half its deviation, and it
# takes a few steps to narrow again.
SPREAD_SMOOTHING = 0.8


class SpeedMeter:
    """Samples per second of one worker: ``add(samples, seconds)`` per step, ``speed``."""

    def __init__(self, smoothing: float = 0.5, *, skip: int = 1, jump: float = 1.5,
                 jump_is_change: bool = False) -> None:
        """``smoothing`` is the weight of the past (0: the last step alone); ``skip``
        first steps are not counted (the first pass pays one-off costs: lazy
        initialisation, the bucket rebuild, allocator warm-up); ``jump``: the ratio to
        the average beyond which a step restarts it (``math.inf``: never);
        ``jump_is_change``: a jump restarts the spread too, at the prior, instead of
        widening it (for measurements that average many steps, as a round's do: there
        a jump is a new speed, not noise)."""
        if not isinstance(smoothing, (int, float)) or not 0.0 <= smoothing < 1.0:
            raise ConfigError(
                f"smoothing={smoothing!r} is invalid: it must be in [0, 1) (the weight "
                "of past steps in the average; 0.5 halves an old measurement's weight "
                "every step)"
            )
        if not isinstance(skip, int) or skip < 0:
            raise ConfigError(f"skip={skip!r} is invalid: give the number of first steps "
                              "to ignore, an integer >= 0")
        if not isinstance(jump, (int, float)) or not jump > 1.0:
            raise ConfigError(f"jump={jump!r} is invalid: it is a ratio > 1 (e.g. 1.5: a "
                              "step 1.5x slower or faster than the average restarts it)")
        self.smoothing, self._skip, self._jump = float(smoothing), skip, float(jump)
        self._jump_is_change = jump_is_change
        self._average = 0.0  # biased EMA of seconds per sample
        self._count = 0  # measurements folded in
        self._seen = 0  # measurements offered, skipped ones included
        self._square = PRIOR_SPREAD ** 2  # EMA of a step's squared log deviation

    def add(self, samples: float, seconds: float) -> None:
        """Fold in one step: ``samples`` trained on in ``seconds`` of local compute."""
        if not (math.isfinite(samples) and math.isfinite(seconds)) or samples <= 0 or seconds <= 0:
            return  # nothing trained, or a clock that did not run: nothing learned
        self._seen += 1
        if self._seen <= self._skip:
            return
        value, past = seconds / samples, self.smoothing
        if self._count:
            ratio = value / self._corrected()
            jumped = not 1.0 / self._jump < ratio < self._jump
            if jumped and self._jump_is_change:
                self._square = PRIOR_SPREAD ** 2
            else:
                self._square = (SPREAD_SMOOTHING * self._square
                                + (1.0 - SPREAD_SMOOTHING) * math.log(ratio) ** 2)
            if jumped:
                self._average, self._count = 0.0, 0  # a new speed: start again from this step
        self._average = past * self._average + (1.0 - past) * value
        self._count += 1

    @property
    def measured(self) -> bool:
        return self._count > 0

    @property
    def speed(self) -> float | None:
        """Samples per second (None until a step was measured)."""
        if self._count == 0:
            return None
        return 1.0 / self._corrected()

    @property
    def spread(self) -> float:
        """How far one step's seconds per sample typically lie from the average, as a
        fraction (the root mean square of its log ratio to the average)."""
        return math.sqrt(self._square)

    @property
    def uncertainty(self) -> float | None:
        """The relative standard error of ``speed`` (None until measured): the spread
        over the steps averaged, by their weights. A restart leaves one step, so the
        speed right after a jump is as uncertain as a single step."""
        if self._count == 0:
            return None
        past, count = self.smoothing, self._count
        # the sum of the squared weights of the bias-corrected average's steps
        weights = (1.0 - past) * (1.0 + past ** count) / ((1.0 + past) * (1.0 - past ** count))
        return self.spread * math.sqrt(weights)

    def _corrected(self) -> float:
        """The bias-corrected average seconds per sample (``_count`` > 0)."""
        return self._average / (1.0 - self.smoothing ** self._count)

    def seed(self, speed: float) -> None:
        """Start from a known speed (a resumed run's record) as one measurement."""
        if math.isfinite(speed) and speed > 0:
            self._average = (1.0 - self.smoothing) / speed
            self._count, self._seen = 1, max(self._seen, self._skip + 1)

    def state_dict(self) -> dict[str, Any]:
        return {"average": self._average, "count": self._count, "seen": self._seen,
                "square": self._square}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._average = float(state["average"])
        self._count, self._seen = int(state["count"]), int(state["seen"])
        self._square = float(state.get("square", PRIOR_SPREAD ** 2))
