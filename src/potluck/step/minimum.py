"""``MinimumSize``: below how many workers an elastic cohort stops training, and for how long
it then waits for joiners before it checkpoints and stops (``potluck run --min-workers``).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from potluck.errors import ConfigError


@dataclass(frozen=True)
class MinimumSize:
    workers: int = 1
    """Below this many members the cohort does not train; 1 never stops it."""
    timeout: float = 60.0
    """Seconds to wait for joiners below ``workers`` before checkpointing and stopping."""

    def __post_init__(self) -> None:
        if (isinstance(self.workers, bool) or not isinstance(self.workers, numbers.Integral)
                or isinstance(self.timeout, bool) or not isinstance(self.timeout, numbers.Real)
                or self.workers < 1 or not float(self.timeout) > 0):
            raise ConfigError(
                f"MinimumSize(workers={self.workers!r}, timeout={self.timeout!r}): workers "
                "must be an int >= 1 and timeout a number of seconds > 0, e.g. "
                "MinimumSize(2, 60.0)"
            )
        object.__setattr__(self, "workers", int(self.workers))  # (a numpy integer too)
        object.__setattr__(self, "timeout", float(self.timeout))

    def stop_message(self, world_size: int, steps: int, where: str) -> str:
        return (
            f"the cohort had {world_size} worker(s), below min_workers={self.workers}, and "
            f"nobody joined within {self.timeout:g} s; step {steps} is saved in {where}: "
            f"start the job again with at least {self.workers} workers and resume from it "
            "(potluck.prepare(..., resume=True, checkpoint_dir=...)), or lower --min-workers"
        )
