"""potluck: distributed data-parallel training for PyTorch on uneven, unreliable GPUs.

The public API is what ``__all__`` lists; everything else is internal.
"""

from __future__ import annotations

from potluck.cohort import Cohort, init
from potluck.errors import (
    CommunicationError,
    ConfigError,
    ModelMismatchError,
    PeerLostError,
    PotluckError,
    ReducerError,
    RendezvousError,
)
from potluck.reducer import Bucket, DataParallel, allreduce_mean, weighted_mean

__version__ = "0.1.0"

__all__ = [
    "Bucket",
    "Cohort",
    "CommunicationError",
    "ConfigError",
    "DataParallel",
    "ModelMismatchError",
    "PeerLostError",
    "PotluckError",
    "ReducerError",
    "RendezvousError",
    "__version__",
    "allreduce_mean",
    "init",
    "weighted_mean",
]
