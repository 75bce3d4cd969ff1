"""``ElasticOptimizer``: the commit point of the step transaction.

``step()`` applies the update only if every collective of the step succeeded (the
model is a ``DataParallel`` with ``on_failure="abandon"``); then the data cursor
commits. If the step failed, it moves the cohort to the next generation, hands the new
group to the model and the optimizer, and leaves the cursor where it was: the
``ElasticLoader`` hands out the same slice again, split among the survivors.
"""

from __future__ import annotations

from typing import Any

from potluck.data import DataCursor
from potluck.elastic.cohort import ElasticCohort
from potluck.step import GuardedOptimizer, StepResult


class ElasticOptimizer:
    """Wraps a ``GuardedOptimizer``; call ``step()`` once per batch, as usual."""

    def __init__(self, optimizer: GuardedOptimizer, model: Any, cohort: ElasticCohort,
                 cursor: DataCursor) -> None:
        self.optimizer, self.model, self.cohort, self.cursor = optimizer, model, cohort, cursor
        optimizer.model = model  # a failed step must never be applied
        self.redone = 0

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> StepResult:
        result = self.optimizer.step()
        if result.failed:
            self.redone += 1
            self.cohort.recover("a collective of the step failed")
            self.model.set_group(self.cohort.group)
            self.optimizer.set_group(self.cohort.group)
        else:  # committed, or skipped for a non-finite gradient: that batch is done
            self.cursor.commit()
        return result
