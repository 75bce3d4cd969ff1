"""Durable training state: atomic, checksummed, optionally async checkpoints; RNG states."""

from potluck.checkpoint.fileformat import read_checkpoint, write_checkpoint
from potluck.checkpoint.manager import Checkpoint, CheckpointManager, PendingSave
from potluck.checkpoint.rng import (
    DistributedRng,
    capture_rng,
    derive_rng,
    restore_rng,
    rng_for_rank,
)

__all__ = [
    "Checkpoint",
    "CheckpointManager",
    "DistributedRng",
    "PendingSave",
    "capture_rng",
    "derive_rng",
    "read_checkpoint",
    "restore_rng",
    "rng_for_rank",
    "write_checkpoint",
]
