"""The step loader: always this rank's part of the step the cursor points at.

Unlike a prefetching loader it reads the cursor and the current membership afresh
before every step, so the user's ordinary ``for batch in loader`` loop redoes a failed
step for free: the cursor did not advance (nothing committed), the membership changed,
and the same slice of the epoch is split again among the survivors. Iteration ends at
the end of the cursor's current epoch. Each rank's part is its share of the block
(``shares(world_size)``: a share policy's, equal by default).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data import default_collate

from potluck.data.cursor import DataCursor
from potluck.data.split import equal_shares
from potluck.errors import CursorError

Membership = Callable[[], tuple[int, int]]  # () -> (rank, world_size), read every step


class StepLoader:
    """Yields ``collate([dataset[i] for i in this rank's indices])`` step by step."""

    def __init__(self, dataset: Any, cursor: DataCursor, membership: Membership, *,
                 collate: Callable[[list[Any]], Any] | None = None,
                 shares: Callable[[int], Sequence[float]] = equal_shares,
                 max_repeats: int = 100, stop: Callable[[], bool] | None = None) -> None:
        self.dataset, self.cursor, self.membership = dataset, cursor, membership
        self.shares = shares
        self.stop = stop or (lambda: False)  # e.g. lambda: optimizer.left
        self.collate = collate or default_collate
        self.max_repeats = max_repeats  # the same step yielded this often: a loop bug

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (the cursor's committed epoch)."""
        return self.cursor.epoch

    def __iter__(self) -> Iterator[Any]:
        epoch = self.cursor.epoch
        last, repeats = None, 0
        while self.cursor.epoch == epoch and not self._epoch_done() and not self.stop():
            state = self.cursor.state
            repeats = repeats + 1 if state == last else 0
            if repeats > self.max_repeats:
                raise CursorError(
                    f"step at sample {state.cursor} of epoch {state.epoch} was handed out "
                    f"{repeats} times without a commit: call the optimizer's step() "
                    "(potluck.prepare's, or cursor.commit()) once per batch"
                )
            last = state
            rank, world_size = self.membership()
            indices = self.cursor.rank_indices(rank, self.shares(world_size))
            if not indices:
                raise CursorError(
                    f"rank {rank} of {world_size} has no sample in the step at sample "
                    f"{state.cursor} (a block of {len(self.cursor.global_indices())}); every "
                    "rank must train on at least one sample per step: use a global batch "
                    "of at least the world size and DataCursor(drop_last=True)"
                )
            yield self.collate([self.dataset[i] for i in indices])

    def _epoch_done(self) -> bool:
        return not self.cursor.global_indices()
