"""One global step as a transaction: accumulation, the guarded optimizer, commit or redo,
the boundary, the live state, and the parts that plug into it."""

from potluck.step.accumulate import accumulate, split_batch
from potluck.step.guard import GuardedOptimizer, StepResult
from potluck.step.minimum import MinimumSize
from potluck.step.parts import EqualShares, SharePolicy, StepPart
from potluck.step.transaction import StepTransaction

__all__ = ["EqualShares", "GuardedOptimizer", "MinimumSize", "SharePolicy", "StepPart",
           "StepResult", "StepTransaction", "accumulate", "split_batch"]
