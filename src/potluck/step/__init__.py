"""The training essentials around one global step: accumulation and a guarded optimizer."""

from potluck.step.accumulate import accumulate, split_batch
from potluck.step.guard import GuardedOptimizer, StepResult

__all__ = ["GuardedOptimizer", "StepResult", "accumulate", "split_batch"]
