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
    size, anchor = _counted(batch)
    if micro_batches < 1:
        raise ConfigError(f"micro_batches must be >= 1, got {micro_batches}")
    if size == 0:
        return []
    count = min(micro_batches, size)
    bounds = [size * k // count for k in range(count + 1)]
    return [
        (_slice(batch, start, stop, anchor), (stop - start) / size)
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
    return _counted(batch)[0]


def _counted(batch: Any) -> tuple[int, int | None]:
    """``batch``'s number of samples, and the anchor that decided its lists."""
    anchor = _anchor(batch)
    size = _size(batch, anchor)
    if size is None:
        raise ConfigError(
            f"a batch to split must hold at least one tensor or list of samples, got "
            f"{type(batch).__name__}; pass a tensor, or a tuple/list/dict of them")
    return size, anchor


def _anchor(batch: Any) -> int | None:
    """The number of samples its unambiguous parts say (tensors, and tuples or lists of
    strings or numbers), if they agree; what decides an ambiguous list (``_size``)."""
    found: set[int] = set()

    def walk(part: Any) -> None:
        if isinstance(part, torch.Tensor):
            if part.dim():
                found.add(int(part.shape[0]))
        elif isinstance(part, dict):
            for value in part.values():
                walk(value)
        elif isinstance(part, (list, tuple)):
            if isinstance(part, list) and _tensors(part):
                return  # ambiguous: what the anchor decides
            if _samples(part, None):
                found.add(len(part))  # one per sample
            else:
                for item in part:
                    walk(item)

    walk(batch)
    return found.pop() if len(found) == 1 else None


def _plain(item: Any) -> bool:
    """A value the split keeps whole: a string, a number, None, a 0-d tensor."""
    return not isinstance(item, (torch.Tensor, dict, list, tuple)) or (
        isinstance(item, torch.Tensor) and item.dim() == 0)


def _tensors(items: list[Any] | tuple[Any, ...]) -> bool:
    return bool(items) and all(isinstance(i, torch.Tensor) and i.dim() for i in items)


def _size(batch: Any, anchor: int | None) -> int | None:
    """Samples in ``batch``, or None for a value the split leaves whole (``_plain``). A
    tensor's are its first dimension; a dict's values are fields, which must agree. A
    tuple or list of strings or numbers is one per sample. A list of tensors is fields
    when they share the first dimension the batch's other parts have (``anchor``; torch's
    ``default_collate`` of tuples), a list of samples when its length is that number
    (sequences, one per sample), and refused when it is neither; with nothing else to
    go by, fields if their first dimensions agree, samples if not. A list of tuples or
    dicts is samples (a collate that keeps them); other tuples are fields."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if isinstance(batch, dict):
        return _agreed(list(batch.items()), anchor)
    if isinstance(batch, (list, tuple)):
        samples = _samples(batch, anchor)
        if samples:
            return len(batch)
        return _agreed(list(enumerate(batch)), anchor)
    return None


def _samples(items: list[Any] | tuple[Any, ...], anchor: int | None) -> bool:
    """Whether ``items`` is a list of samples, not of fields (``_size``)."""
    if items and all(_plain(item) for item in items):
        return True
    if isinstance(items, tuple) or not items:
        return False
    if _tensors(items):
        firsts = {int(item.shape[0]) for item in items}
        if anchor is None:
            return len(firsts) > 1
        if firsts == {anchor}:
            return False
        if len(items) == anchor:
            return True
        raise ConfigError(
            f"a batch to split has a list of {len(items)} tensors whose first dimensions "
            f"({sorted(firsts)}) are not its {anchor} samples, nor is the list one per "
            "sample: split it yourself, or make the list one entry per sample")
    return all(isinstance(item, (tuple, dict)) for item in items)


def _agreed(fields: list[tuple[Any, Any]], anchor: int | None) -> int | None:
    """The fields' common number of samples (None if none has one)."""
    sizes = {name: size for name, size in ((name, _size(v, anchor)) for name, v in fields)
             if size is not None}
    if len(set(sizes.values())) > 1:
        raise ConfigError(
            f"a batch to split must have one number of samples in every field, got "
            f"{sizes} (by field); split it yourself, or make every field hold one entry "
            "per sample (a list of samples: strings, numbers, tuples, dicts, or tensors of "
            "different lengths)")
    return next(iter(sizes.values()), None)


def _slice(batch: Any, start: int, stop: int, anchor: int | None) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[start:stop] if batch.dim() else batch
    if isinstance(batch, dict):
        return {k: _slice(v, start, stop, anchor) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        if _samples(batch, anchor):
            return batch[start:stop]
        fields = [_slice(v, start, stop, anchor) for v in batch]
        return type(batch)(*fields) if hasattr(batch, "_fields") else type(batch)(fields)
    return batch
