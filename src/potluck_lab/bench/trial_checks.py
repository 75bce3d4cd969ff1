"""What every chaos trial checks (the random faults, the store's host, churn): each
bench's result adds its own recovery figures to these."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(kw_only=True)
class TrialChecks:
    completed: bool = False
    exactly_once: bool = False
    replicas_equal: bool = False
    max_param_diff: float = math.nan  # the finishers vs one process
    leftover: list[int] = field(default_factory=list)  # process groups left behind
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return (self.completed and self.exactly_once and self.replicas_equal
                and not self.leftover and not self.problems)
