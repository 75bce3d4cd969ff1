"""potluck: distributed data-parallel training for PyTorch on uneven, unreliable GPUs.

The public API is what ``__all__`` lists; everything else is internal.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from potluck import protocol

if TYPE_CHECKING:
    from potluck.balance import BalanceConfig
    from potluck.checkpoint import CheckpointManager, DistributedRng, capture_rng, restore_rng
    from potluck.cohort import Cohort
    from potluck.cohort.init import init
    from potluck.data import DataCursor, ShardedLoader
    from potluck.errors import (
        AdmissionError,
        CheckpointError,
        CommunicationError,
        ConfigError,
        CorruptCheckpointError,
        CursorError,
        LoaderWorkerError,
        ModelMismatchError,
        PeerLostError,
        PotluckError,
        ReducerError,
        RendezvousError,
    )
    from potluck.group import GroupHandle
    from potluck.preparation import prepare
    from potluck.reducer import Bucket, DataParallel, allreduce_mean, weighted_mean
    from potluck.step import GuardedOptimizer, MinimumSize, StepTransaction
    from potluck.step.accumulate import accumulate
    from potluck.step.fit import fit_backward
    from potluck.sync import DiLoCo, LocalSGD, StreamingDiLoCo
    from potluck.trust import Trust

# Imported on first use: ``potluck run`` and ``potluck --help`` need none of it, and
# the launcher starts its workers while it imports torch.
_LAZY = {
    "AdmissionError": "potluck.errors",
    "BalanceConfig": "potluck.balance",
    "Bucket": "potluck.reducer",
    "CheckpointError": "potluck.errors",
    "CheckpointManager": "potluck.checkpoint",
    "Cohort": "potluck.cohort",
    "CommunicationError": "potluck.errors",
    "ConfigError": "potluck.errors",
    "CorruptCheckpointError": "potluck.errors",
    "CursorError": "potluck.errors",
    "DataCursor": "potluck.data",
    "DataParallel": "potluck.reducer",
    "DiLoCo": "potluck.sync",
    "DistributedRng": "potluck.checkpoint",
    "GroupHandle": "potluck.group",
    "GuardedOptimizer": "potluck.step",
    "LoaderWorkerError": "potluck.errors",
    "LocalSGD": "potluck.sync",
    "SpotCheck": "potluck.trust",
    "StreamingDiLoCo": "potluck.sync",
    "Trust": "potluck.trust",
    "MinimumSize": "potluck.step",
    "ModelMismatchError": "potluck.errors",
    "PeerLostError": "potluck.errors",
    "PotluckError": "potluck.errors",
    "ReducerError": "potluck.errors",
    "RendezvousError": "potluck.errors",
    "ShardedLoader": "potluck.data",
    "StepTransaction": "potluck.step",
    "accumulate": "potluck.step",
    "fit_backward": "potluck.step.fit",
    "allreduce_mean": "potluck.reducer",
    "capture_rng": "potluck.checkpoint",
    "init": "potluck.cohort",
    "prepare": "potluck.preparation",
    "restore_rng": "potluck.checkpoint",
    "weighted_mean": "potluck.reducer",
}
# Subpackages the API names as ``potluck.<name>.X`` (README), imported on first use too.
_LAZY_SUBMODULES = ("compress",)

__version__ = protocol.VERSION  # (one place: the cohort compares it)

__all__ = [
    "AdmissionError",
    "BalanceConfig",
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
    "DiLoCo",
    "DistributedRng",
    "GroupHandle",
    "GuardedOptimizer",
    "LoaderWorkerError",
    "LocalSGD",
    "MinimumSize",
    "ModelMismatchError",
    "PeerLostError",
    "PotluckError",
    "ReducerError",
    "RendezvousError",
    "ShardedLoader",
    "SpotCheck",
    "StepTransaction",
    "StreamingDiLoCo",
    "Trust",
    "__version__",
    "accumulate",
    "allreduce_mean",
    "capture_rng",
    "fit_backward",
    "init",
    "prepare",
    "restore_rng",
    "weighted_mean",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return import_module(f"potluck.{name}")  # which also sets it here, as an import does
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'potluck' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
