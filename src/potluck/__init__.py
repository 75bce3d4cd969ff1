"""potluck: distributed data-parallel training for PyTorch on uneven, unreliable GPUs.

The public API is what ``__all__`` lists; everything else is internal.
"""

from __future__ import annotations

from potluck.errors import (
    CommunicationError,
    ConfigError,
    ModelMismatchError,
    PotluckError,
    ReducerError,
)
from potluck.reducer import Bucket, DataParallel, allreduce_mean, weighted_mean

__version__ = "0.1.0"

__all__ = [
    "Bucket",
    "CommunicationError",
    "ConfigError",
    "DataParallel",
    "ModelMismatchError",
    "PotluckError",
    "ReducerError",
    "__version__",
    "allreduce_mean",
    "weighted_mean",
]
