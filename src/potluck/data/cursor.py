"""The data cursor: which samples each global step consumes, advanced only on commit.

A ``DataCursor`` is replicated: every rank holds one with the same settings and calls
``commit()`` after each step whose optimizer update went through, so all copies agree.
Splitting among ranks happens per step from the committed position, which is why a new
world size or new shares need nothing more than a new iterator (``batch_sampler`` or
``loader``) made after the change: the rest of the epoch is re-split without loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from potluck.data.permutation import epoch_permutation
from potluck.data.split import check_rank, resolve_shares, split_block
from potluck.data.state import CursorState

if TYPE_CHECKING:
    from potluck.data.loader import ShardedLoader
    from potluck.data.sampler import CursorBatchSampler


class DataCursor:
    """Exactly-once sample order for data-parallel training, with a tiny resumable state.

    Args:
        dataset_len: number of samples in the dataset (``len(dataset)``).
        global_batch: samples per global step, all ranks together.
        seed: seeds every epoch's permutation together with the epoch number.
        drop_last: drop the epoch's last ``dataset_len % global_batch`` samples (True) or
            train on them in a short final step (False).
    """

    def __init__(self, dataset_len: int, global_batch: int, *, seed: int = 0,
                 drop_last: bool = False) -> None:
        self._state = CursorState(dataset_len, global_batch, drop_last=drop_last, seed=seed)
        self._perm: tuple[int, int, torch.Tensor] | None = None  # (seed, epoch, perm)

    def __repr__(self) -> str:
        return f"DataCursor({self._state})"

    @property
    def state(self) -> CursorState:
        """The committed state (immutable; a commit replaces it)."""
        return self._state

    @property
    def epoch(self) -> int:
        return self._state.epoch

    @property
    def cursor(self) -> int:
        """Position of the next step's first sample in the epoch permutation."""
        return self._state.cursor

    def commit(self, lost: tuple[tuple[int, int], ...] = ()) -> None:
        """Mark the current step as trained; the next step starts after its block.
        ``lost``: positions of the block that did not reach the model (a worker lost
        mid-round); they are handed out again as steps of their own, before the rest."""
        self._state = self._state.advanced(lost)

    def permutation(self, epoch: int) -> torch.Tensor:
        """Epoch ``epoch``'s sample order (cached for the latest epoch asked for)."""
        seed = self._state.seed
        if self._perm is None or self._perm[:2] != (seed, epoch):
            self._perm = (seed, epoch, epoch_permutation(self._state.dataset_len, seed, epoch))
        return self._perm[2]

    def global_indices(self, state: CursorState | None = None) -> list[int]:
        """Dataset indices of the whole step at ``state`` (default: the committed one)."""
        state = self._state if state is None else state
        start, stop = state.block
        return self.permutation(state.epoch)[start:stop].tolist()

    def rank_indices(self, rank: int, shares: Sequence[float] | None = None, *,
                     world_size: int | None = None,
                     state: CursorState | None = None) -> list[int]:
        """Dataset indices that ``rank`` trains on in the step at ``state``."""
        values = resolve_shares(shares, world_size)
        check_rank(rank, len(values))
        state = self._state if state is None else state
        part = split_block(*state.block, values)[rank]
        return self.permutation(state.epoch)[part.start:part.stop].tolist()

    def state_dict(self) -> dict[str, Any]:
        """Plain ints: configuration (for validation on load) and position (with the
        owed ranges, as lists of two ints)."""
        return self._state.to_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume at a saved position; the dataset length and settings must match."""
        self._state = self._state.load(state_dict)

    def batch_sampler(self, rank: int, shares: Sequence[float] | None = None, *,
                      world_size: int | None = None) -> CursorBatchSampler:
        """A ``batch_sampler`` for ``torch.utils.data.DataLoader`` serving ``rank``."""
        from potluck.data.sampler import CursorBatchSampler

        return CursorBatchSampler(self, rank, shares, world_size=world_size)

    def loader(self, dataset: Any, *, rank: int, shares: Sequence[float] | None = None,
               world_size: int | None = None, **dataloader_kwargs: Any) -> ShardedLoader:
        """A DataLoader over ``dataset`` for ``rank``; see ``ShardedLoader``."""
        from potluck.data.loader import ShardedLoader

        return ShardedLoader(dataset, self, rank=rank, shares=shares, world_size=world_size,
                             **dataloader_kwargs)
