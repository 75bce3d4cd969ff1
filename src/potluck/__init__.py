"""potluck: distributed data-parallel training for PyTorch on uneven, unreliable GPUs.

The public API is what ``__all__`` lists; everything else is internal.
"""

from __future__ import annotations

from potluck.checkpoint import CheckpointManager, DistributedRng, capture_rng, restore_rng
from potluck.data import DataCursor, ShardedLoader
from potluck.errors import (
    CheckpointError,
    CommunicationError,
    ConfigError,
    CorruptCheckpointError,
    CursorError,
    ModelMismatchError,
    PotluckError,
    ReducerError,
)
from potluck.reducer import Bucket, DataParallel, allreduce_mean, weighted_mean

__version__ = "0.1.0"

__all__ = [
    "Bucket",
    "CheckpointError",
    "CheckpointManager",
    "CommunicationError",
    "ConfigError",
    "CorruptCheckpointError",
    "CursorError",
    "DataCursor",
    "DataParallel",
    "DistributedRng",
    "ModelMismatchError",
    "PotluckError",
    "ReducerError",
    "ShardedLoader",
    "__version__",
    "allreduce_mean",
    "capture_rng",
    "restore_rng",
    "weighted_mean",
]
