"""potluck: distributed data-parallel training for PyTorch on uneven, unreliable GPUs.

The public API is what ``__all__`` lists; everything else is internal.
"""

from __future__ import annotations

from potluck.checkpoint import CheckpointManager, DistributedRng, capture_rng, restore_rng
from potluck.cohort import Cohort, init
from potluck.data import DataCursor, ShardedLoader
from potluck.errors import (
    AdmissionError,
    CheckpointError,
    CommunicationError,
    ConfigError,
    CorruptCheckpointError,
    CursorError,
    ModelMismatchError,
    PeerLostError,
    PotluckError,
    ReducerError,
    RendezvousError,
)
from potluck.group import GroupHandle
from potluck.prepare import prepare
from potluck.reducer import Bucket, DataParallel, allreduce_mean, weighted_mean
from potluck.step import GuardedOptimizer, MinimumSize, StepTransaction, accumulate

__version__ = "0.1.0"

__all__ = [
    "AdmissionError",
    "Bucket",
    "CheckpointError",
    "CheckpointManager",
    "Cohort",
    "CommunicationError",
    "ConfigError",
    "CorruptCheckpointError",
    "CursorError",
    "DataCursor",
    "DataParallel",
    "DistributedRng",
    "GroupHandle",
    "GuardedOptimizer",
    "MinimumSize",
    "ModelMismatchError",
    "PeerLostError",
    "PotluckError",
    "ReducerError",
    "RendezvousError",
    "ShardedLoader",
    "StepTransaction",
    "__version__",
    "accumulate",
    "allreduce_mean",
    "capture_rng",
    "init",
    "prepare",
    "restore_rng",
    "weighted_mean",
]
