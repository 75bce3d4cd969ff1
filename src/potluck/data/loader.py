"""``ShardedLoader``: a DataLoader on a cursor batch sampler that checks the commits.

Iterating it yields this rank's batches for the rest of the current epoch, starting at
the committed cursor. Before yielding step k it checks that the cursor has committed
exactly the k steps before it (the loop must call ``cursor.commit()`` once per step,
after the optimizer step), so a forgotten or doubled commit fails loudly instead of
silently skipping or repeating data. After a failed step, a ``reshard`` or a
``load_state_dict``, start a new ``for`` loop: it resumes at the committed position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, default_collate

from potluck.data.permutation import mix
from potluck.data.sampler import CursorBatchSampler
from potluck.errors import ConfigError, CursorError

if TYPE_CHECKING:
    from potluck.data.cursor import DataCursor

_NOT_ALLOWED = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")


class EmptySafeCollate:
    """Collates a batch, or returns None for a rank's empty share of a step."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any] | None = None) -> None:
        self.collate_fn = collate_fn or default_collate

    def __call__(self, batch: list[Any]) -> Any:
        return self.collate_fn(batch) if batch else None


class ShardedLoader:
    """One rank's DataLoader over ``dataset``, driven by a ``DataCursor``.

    ``dataloader_kwargs`` go to ``torch.utils.data.DataLoader`` (``num_workers``,
    ``prefetch_factor``, ``pin_memory``, ``collate_fn``...); batching and order belong to
    the cursor, so ``batch_size``, ``shuffle``, ``sampler``, ``batch_sampler`` and
    ``drop_last`` are refused. A step where this rank's share is empty yields ``None``.
    With ``strict=False`` the commit check is skipped.

    Unless ``generator`` is given, each ``for`` loop seeds the DataLoader's generator
    from the cursor (seed, epoch, position). A DataLoader otherwise draws its workers'
    base seed from the *global* torch generator at every ``iter()``, so a resumed run
    would draw one number more than the uninterrupted one and drift from it.
    """

    def __init__(self, dataset: Any, cursor: DataCursor, *, rank: int,
                 shares: Sequence[float] | None = None, world_size: int | None = None,
                 strict: bool = True, **dataloader_kwargs: Any) -> None:
        refused = sorted(set(dataloader_kwargs) & set(_NOT_ALLOWED))
        if refused:
            raise ConfigError(
                f"ShardedLoader got {refused}: the cursor decides batching and order. Set "
                "global_batch / drop_last / seed on the DataCursor instead."
            )
        if hasattr(dataset, "__len__") and len(dataset) != cursor.state.dataset_len:
            raise ConfigError(
                f"len(dataset)={len(dataset)} but the cursor was made for dataset_len="
                f"{cursor.state.dataset_len}: build the cursor with len(dataset)."
            )
        self.cursor = cursor
        self.strict = strict
        self.sampler = CursorBatchSampler(cursor, rank, shares, world_size=world_size)
        self._own_generator = "generator" not in dataloader_kwargs
        collate = EmptySafeCollate(dataloader_kwargs.pop("collate_fn", None))
        self.dataloader: DataLoader[Any] = DataLoader(
            dataset, batch_sampler=self.sampler, collate_fn=collate, **dataloader_kwargs
        )

    def reshard(self, rank: int, shares: Sequence[float] | None = None, *,
                world_size: int | None = None) -> None:
        """Serve a new rank / shares from the next ``for`` loop on."""
        self.sampler.reshard(rank, shares, world_size=world_size)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        expected = self.sampler.steps()
        if self._own_generator:
            state = self.cursor.state
            seed = mix(mix(state.seed, state.epoch), state.cursor)
            self.dataloader.generator = torch.Generator().manual_seed(seed)
        for step, batch in enumerate(self.dataloader):
            if self.strict and self.cursor.state != expected[step]:
                raise CursorError(
                    f"step {step} of this loop expects the committed cursor at "
                    f"{_where(expected[step])} but it is at {_where(self.cursor.state)}: call "
                    "cursor.commit() exactly once per trained step, and start a new loop "
                    "after a failed step, reshard() or load_state_dict()."
                )
            yield batch


def _where(state: Any) -> str:
    return f"epoch {state.epoch}, sample {state.cursor}"
