"""Reading one batch: ``collate([dataset[i] for i in indices])`` under a seed of its own.

Every batch the step loader hands out is a run of positions ``[start, stop)`` in one
epoch's permutation (a rank's part of a step, or one local step of a round's part), so
a ``BatchKey(epoch, start, stop)`` names it, and a seed drawn from the loader's seed and
the key (``batch_seed``) seeds the random state it is read under: torch's CPU
generator, Python's ``random`` and NumPy's global one. A dataset that augments with
them (random crops, masking) then reads the same batch the same way wherever it is
read: in a worker process or in this one, prefetched or not, on a run resumed
mid-epoch, or by another rank recomputing it for a spot check. Whatever the number of
worker processes, training is the same. This process's own random state is put back
after a read here (``read_batch``), so reading never moves the training's.

A ``Fetcher`` reads batches by key: ``InProcess`` here, ``workers.WorkerPool`` in
worker processes, ahead of the loop.
"""

from __future__ import annotations

import hashlib
import random
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import torch

Collate = Callable[[list[Any]], Any]


class BatchKey(NamedTuple):
    """Positions ``[start, stop)`` of epoch ``epoch``'s permutation."""

    epoch: int
    start: int
    stop: int


class Planned(NamedTuple):
    """A batch the loader hands out or expects to: its key, its dataset indices and the
    seed it is read under (``batch_seed``)."""

    key: BatchKey
    indices: list[int]
    seed: int


def batch_seed(seed: int, key: BatchKey) -> int:
    """A 63-bit seed from the loader's ``seed`` and the batch's key (the same on every
    machine: no Python ``hash``, which is salted per process for strings)."""
    text = f"{seed}:{key.epoch}:{key.start}:{key.stop}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 1


def seeded_read(dataset: Any, collate: Collate, indices: Sequence[int], seed: int) -> Any:
    """Seed the process's random state with ``seed`` and read the batch (a worker
    process's whole job: its random state is its own)."""
    torch.default_generator.manual_seed(seed)  # (the CPU's only: not an accelerator's)
    random.seed(seed)
    numpy = sys.modules.get("numpy")  # (seeded only where something imported it)
    if numpy is not None:
        numpy.random.seed(seed % (1 << 32))
    return collate([dataset[i] for i in indices])


def read_batch(dataset: Any, collate: Collate, indices: Sequence[int], seed: int) -> Any:
    """``seeded_read`` in this process, its random state put back afterwards."""
    numpy = sys.modules.get("numpy")
    kept_torch, kept_random = torch.default_generator.get_state(), random.getstate()
    kept_numpy = numpy.random.get_state() if numpy is not None else None
    try:
        return seeded_read(dataset, collate, indices, seed)
    finally:
        torch.default_generator.set_state(kept_torch)
        random.setstate(kept_random)
        if numpy is not None and kept_numpy is not None:
            numpy.random.set_state(kept_numpy)


class Fetcher(Protocol):
    """Reads batches by key. ``get`` returns the batch of ``wanted`` (read ahead if it
    was planned, else now) and then plans ``ahead``: the batches expected next, in
    order (a planned batch not among them any more is dropped)."""

    def get(self, wanted: Planned, ahead: Sequence[Planned]) -> Any: ...

    def close(self) -> None: ...


class InProcess:
    """Reads each batch here, when it is asked for (no reading ahead)."""

    def __init__(self, dataset: Any, collate: Collate) -> None:
        self._dataset, self._collate = dataset, collate

    def get(self, wanted: Planned, ahead: Sequence[Planned]) -> Any:
        return read_batch(self._dataset, self._collate, wanted.indices, wanted.seed)

    def close(self) -> None:
        return None
