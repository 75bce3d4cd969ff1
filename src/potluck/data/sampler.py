"""A DataLoader batch sampler that serves one rank's part of each step from the cursor.

Each ``iter()`` starts at the cursor's *committed* position and yields, for every
remaining step of that epoch, the index list of this rank's contiguous sub-block. It
does not wait for commits, so a DataLoader with workers prefetches ahead; the training
loop commits after each step, and after a failed step or a membership change it makes
a new iterator, which starts again at the committed position. ``reshard`` changes the
rank and shares for iterators made afterwards (what an elastic cohort needs).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from torch.utils.data import Sampler

from potluck.data.split import check_rank, resolve_shares, split_block
from potluck.data.state import CursorState

if TYPE_CHECKING:
    from potluck.data.cursor import DataCursor


class CursorBatchSampler(Sampler[list[int]]):
    """Yields ``rank``'s index list for each step from the committed cursor onward.

    A rank whose share of a step is zero gets an empty list for that step (it still
    takes part in the step's collectives).
    """

    def __init__(self, cursor: DataCursor, rank: int, shares: Sequence[float] | None = None,
                 *, world_size: int | None = None) -> None:
        self.cursor = cursor
        self.rank = 0
        self.shares: tuple[float, ...] = ()
        self.reshard(rank, shares, world_size=world_size)

    def reshard(self, rank: int, shares: Sequence[float] | None = None, *,
                world_size: int | None = None) -> None:
        """Serve ``rank`` of a cohort with these shares from the next ``iter()`` on."""
        values = resolve_shares(shares, world_size)
        check_rank(rank, len(values))
        self.rank, self.shares = rank, values

    @property
    def world_size(self) -> int:
        return len(self.shares)

    def steps(self) -> list[CursorState]:
        """The states of the steps a new iterator would serve (rest of the epoch)."""
        return list(self.cursor.state.rest_of_epoch())

    def __iter__(self) -> Iterator[list[int]]:
        start = self.cursor.state
        rank, shares = self.rank, self.shares
        perm = self.cursor.permutation(start.epoch)
        for state in start.rest_of_epoch():
            part = split_block(*state.block, shares)[rank]
            yield perm[part.start:part.stop].tolist()

    def __len__(self) -> int:
        return self.cursor.state.steps_left
