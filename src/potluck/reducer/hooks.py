"""Communication hooks: how one gradient bucket is reduced across the cohort.

A hook is ``hook(state, bucket) -> Future`` whose value is the reduced flat tensor
(or a one-element list of it, as c10d futures give). ``state`` is whatever the user
registered with the hook; ``bucket.group`` is the cohort's ``GroupHandle``, which always
talks on the current membership generation's group, so a hook never holds a stale one.
The reducer writes the result back into ``bucket.buffer`` if the hook returned another
tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from potluck.errors import ConfigError
from potluck.group import GroupHandle


@dataclass(frozen=True)
class Bucket:
    """One flat gradient buffer; the gradients of ``parameters`` are views into it.

    ``produced``: only for a hook that ``carries_bitmap``, and only on the last bucket
    launched in a pass: one byte per parameter of the model (in the reducer's order), 1
    where this rank produced a gradient in the pass, 0 elsewhere. It is in and out: by
    the time the hook's future completes it must hold the agreed bytes, nonzero where
    any rank whose gradient counts produced one, the same on every rank.

    ``count``: the buckets of a pass. The reducer launches them in index order, each
    once, and every one in a pass that does not fail: a hook may leave work of bucket
    ``index`` to its call for the next one, and must finish everything in its call for
    bucket ``count - 1``."""

    index: int
    buffer: torch.Tensor
    parameters: tuple[torch.nn.Parameter, ...]
    group: GroupHandle
    produced: torch.Tensor | None = None
    count: int = 1

    @property
    def world_size(self) -> int:
        return int(self.group.size())

    @property
    def rank(self) -> int:
        return int(self.group.rank())


CommHook = Callable[[Any, Bucket], "torch.futures.Future[Any]"]


@runtime_checkable
class SummingHook(Protocol):
    """A hook that only sums: the reducer weighs each bucket while staging it (``1 / N``,
    or this rank's part of the step), as for the default mean, and the hook adds the
    ranks' buckets up its own way (``potluck.compress.CompressedSum``)."""

    prescaled: bool

    def __call__(self, state: Any, bucket: Bucket) -> torch.futures.Future[Any]: ...


@runtime_checkable
class BitmapCarrier(Protocol):
    """A hook that agrees the unused-parameter bitmap on its own collectives
    (``Bucket.produced``), so the reducer issues no all-reduce of its own for it. A
    collective costs a round of messages however small it is, and where ranks share
    cores a round is a wait for every rank to be scheduled (``potluck.trust``'s exchange
    carries the bitmap on its two all-to-alls)."""

    carries_bitmap: bool

    def __call__(self, state: Any, bucket: Bucket) -> torch.futures.Future[Any]: ...


def carries_bitmap(hook: Any) -> bool:
    """``hook`` agrees the unused-parameter bitmap itself (``BitmapCarrier``)."""
    return isinstance(hook, BitmapCarrier) and hook.carries_bitmap is True


def sums_prescaled(hook: Any) -> bool:
    """The reducer weighs the buckets for ``hook``: the default mean or a summing hook."""
    return hook is allreduce_mean or (isinstance(hook, SummingHook) and hook.prescaled is True)


def allreduce_mean(state: Any, bucket: Bucket) -> torch.futures.Future[Any]:
    """The default: every rank's gradient weighs the same; the result is their mean."""
    bucket.buffer.div_(bucket.world_size)
    future: torch.futures.Future[Any] = bucket.group.allreduce([bucket.buffer]).get_future()
    return future


def weighted_mean(state: Any, bucket: Bucket) -> torch.futures.Future[Any]:
    """Each rank contributes its gradient times its weight; the result is the weighted sum.

    ``state`` is this rank's weight, a float or a zero-argument callable returning one
    (so it can change every step). With weight = local samples / global batch and a loss
    averaged over local samples, the result is the gradient of the global-batch mean,
    however unevenly the batch was split.
    """
    weight = state() if callable(state) else state
    if not isinstance(weight, (int, float)) or weight < 0:
        raise ConfigError(
            f"weighted_mean needs a non-negative float weight per rank, got {weight!r}; "
            "pass e.g. local_batch / global_batch"
        )
    bucket.buffer.mul_(float(weight))
    future: torch.futures.Future[Any] = bucket.group.allreduce([bucket.buffer]).get_future()
    return future
