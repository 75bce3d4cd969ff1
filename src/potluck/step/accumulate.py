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
    """Split ``batch`` (a tensor, or a tuple/list/dict of tensors with the same first
    dimension) into ``micro_batches`` near-equal chunks along dim 0, each with its
    weight ``len(chunk) / len(batch)``. Empty chunks are dropped."""
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
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    items = list(batch.values()) if isinstance(batch, dict) else list(batch)
    sizes = {int(t.shape[0]) for t in items if isinstance(t, torch.Tensor)}
    if len(sizes) != 1:
        raise ConfigError(
            f"a batch to split must hold tensors with one common first dimension, got "
            f"sizes {sorted(sizes)}; split it yourself or pass a tensor / tuple of tensors"
        )
    return sizes.pop()


def _slice(batch: Any, start: int, stop: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, dict):
        return {k: _slice(v, start, stop) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_slice(v, start, stop) for v in batch)
    return batch
