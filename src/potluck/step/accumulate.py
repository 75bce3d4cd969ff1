"""Gradient accumulation: a rank's share of the global batch in several micro-batches.

Each rank may use its own number of micro-batches (a slow or small GPU uses more); only
the last backward of a step communicates, the others run under ``model.no_sync()``.
Every micro-batch comes with the weight its mean loss must be multiplied by, so that
the accumulated gradient is the mean over the rank's whole share, exactly as if the
share had been one batch.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch

from potluck.errors import ConfigError


def split_batch(batch: Any, micro_batches: int) -> list[tuple[Any, float]]:
    """Split ``batch`` (a tensor, or a tuple/list/dict of tensors and lists of samples
    with one number of samples: ``_size``) into ``micro_batches`` near-equal chunks of
    samples, each with its weight ``len(chunk) / len(batch)``. Empty chunks are
    dropped."""
    size = batch_size(batch)
    if micro_batches < 1:
        raise ConfigError(f"micro_batches must be >= 1, got {micro_batches}")
    if size == 0:
        return []
    count = min(micro_batches, size)
    bounds = [size * k // count for k in range(count + 1)]
    return [
        (_slice(batch, start, stop), (stop - start) / size)
        for start, stop in itertools.pairwise(bounds)
    ]


def accumulate(model: Any, batch: Any, micro_batches: int) -> Iterator[tuple[Any, float]]:
    """Yield ``(micro_batch, weight)``; backward of all but the last runs without sync.

    Use::

        for chunk, weight in accumulate(model, (x, y), micro_batches=4):
            (loss_fn(model(chunk[0]), chunk[1]) * weight).backward()
    """
    chunks = split_batch(batch, micro_batches)
    if not chunks:
        raise ConfigError(
            "accumulate() got an empty batch: this rank would skip the synchronized "
            "backward that every other rank waits for; give every rank at least one "
            "sample per step"
        )
    for index, (chunk, weight) in enumerate(chunks):
        last = index == len(chunks) - 1
        no_sync = getattr(model, "no_sync", None)
        context = contextlib.nullcontext() if last or no_sync is None else no_sync()
        with context:
            yield chunk, weight


def batch_size(batch: Any) -> int:
    """The number of samples in ``batch`` (see ``_size``); a ``ConfigError`` where its
    parts disagree or nothing in it says."""
    size = _size(batch)
    if size is None:
        raise ConfigError(
            f"a batch to split must hold at least one tensor or list of samples, got "
            f"{type(batch).__name__}; pass a tensor, or a tuple/list/dict of them")
    return size


def _size(batch: Any) -> int | None:
    """Samples in ``batch``, or None for a value the split leaves whole (a number, a
    string, None, a 0-d tensor). A tensor's are its first dimension. A dict's values and
    a tuple's items are fields, which must agree. A list is a list of samples (one item
    each) when its items are strings or numbers, tuples or dicts (a collate that keeps
    the samples), or tensors of different lengths (variable-length sequences); else its
    items are fields, as in torch's ``default_collate`` output for a batch of tuples."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if isinstance(batch, dict):
        return _agreed(list(batch.items()))
    if isinstance(batch, list) and _samples(batch):
        return len(batch)
    if isinstance(batch, (list, tuple)):
        return _agreed(list(enumerate(batch)))
    return None


def _samples(items: list[Any]) -> bool:
    """Whether the list ``items`` is a list of samples (see ``_size``)."""
    if all(isinstance(item, torch.Tensor) and item.dim() for item in items):
        return len({int(item.shape[0]) for item in items}) > 1
    return all(isinstance(item, (tuple, dict)) for item in items) or all(
        _size(item) is None for item in items)


def _agreed(fields: list[tuple[Any, Any]]) -> int | None:
    """The fields' common number of samples (None if none has one)."""
    sizes = {name: size for name, size in ((name, _size(v)) for name, v in fields)
             if size is not None}
    if len(set(sizes.values())) > 1:
        raise ConfigError(
            f"a batch to split must have one number of samples in every field, got "
            f"{sizes} (by field); split it yourself, or make every field hold one entry "
            "per sample (a list of samples: strings, numbers, tuples, dicts, or tensors of "
            "different lengths)")
    return next(iter(sizes.values()), None)


def _slice(batch: Any, start: int, stop: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[start:stop] if batch.dim() else batch
    if isinstance(batch, dict):
        return {k: _slice(v, start, stop) for k, v in batch.items()}
    if isinstance(batch, list) and _samples(batch):
        return batch[start:stop]
    if isinstance(batch, (list, tuple)):
        fields = [_slice(v, start, stop) for v in batch]
        return type(batch)(*fields) if hasattr(batch, "_fields") else type(batch)(fields)
    return batch
