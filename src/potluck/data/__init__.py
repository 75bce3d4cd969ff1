"""Who trains on what: the epoch permutation, the committed cursor, per-rank shares."""

from potluck.data.cursor import DataCursor
from potluck.data.loader import EmptySafeCollate, ShardedLoader
from potluck.data.permutation import epoch_permutation, mix
from potluck.data.sampler import CursorBatchSampler
from potluck.data.split import split_block, split_counts
from potluck.data.state import CursorState

__all__ = [
    "CursorBatchSampler",
    "CursorState",
    "DataCursor",
    "EmptySafeCollate",
    "ShardedLoader",
    "epoch_permutation",
    "mix",
    "split_block",
    "split_counts",
]
