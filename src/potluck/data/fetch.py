"""Reading one batch: ``collate([dataset[i] for i in indices])``, each sample under a
seed of its own.

Every batch the step loader hands out is a run of positions ``[start, stop)`` in one
epoch's permutation (a rank's part of a step, or one local step of a round's part), so
a ``BatchKey(epoch, start, stop)`` names it. A sample's random draws (torch's CPU
generator, Python's ``random``, NumPy's global generator: random crops, masking) are
seeded from the loader's seed, the epoch and the sample's position (``sample_seed``),
so a sample reads the same wherever and however it is read: in a worker process or in
this one, prefetched or not, in a step split among 2 ranks or 8 or by other shares, on
a run resumed mid-epoch or a step redone by the survivors of a failure, or by another
rank recomputing it for a spot check. N ranks then still train as one process on the
same global batch, and training does not depend on the number of worker processes.
``collate`` runs under the batch's seed (``batch_seed``).

Seeding costs about 15 us a sample for the three generators, so only the generators a
dataset was seen to draw from are seeded per sample (``Draws``): a batch is read, and
if a generator not seeded yet moved during the read, it is seeded from then on and the
batch is read again (once per process and generator). A dataset that draws from none
pays a comparison of states per batch. This holds for a ``__getitem__`` whose result
depends on the index and its draws alone: a generator of the dataset's own
(``numpy.random.default_rng()`` made in ``__getitem__``: seed it from the index), a
draw cached on the dataset at its first read, or a draw that puts the global state
back (``torch.random.fork_rng``) is not seen. ``collate`` draws under the batch's seed,
which depends on the split (mixup in ``collate`` is the split's).

This process's own random state is put back after a read here (``read_batch``), so
reading never moves the training's. A ``Fetcher`` reads batches by key: ``InProcess``
here, ``workers.WorkerPool`` in worker processes, ahead of the loop.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import numpy
import torch

Collate = Callable[[list[Any]], Any]
GENERATORS = ("torch", "random", "numpy")


class BatchKey(NamedTuple):
    """Positions ``[start, stop)`` of epoch ``epoch``'s permutation."""

    epoch: int
    start: int
    stop: int


class Planned(NamedTuple):
    """A batch the loader hands out or expects to: its key, its dataset indices (one per
    position) and the loader's seed (the cursor's)."""

    key: BatchKey
    indices: list[int]
    seed: int


def _seed_of(*parts: int) -> int:
    """A 63-bit seed from whole numbers (the same on every machine: no Python ``hash``)."""
    text = ":".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 1


def sample_seed(seed: int, epoch: int, position: int) -> int:
    return _seed_of(seed, epoch, position)


def batch_seed(seed: int, key: BatchKey) -> int:
    return _seed_of(seed, key.epoch, key.start, key.stop, 1)


class Draws:
    """Which generators reads in this process were seen to draw from (seeded per
    sample from then on); one per process (``DRAWS``)."""

    def __init__(self) -> None:
        self.seeded: set[str] = set()

    def states(self) -> dict[str, Any]:
        """The state of each generator not seeded per sample yet."""
        states: dict[str, Any] = {}
        if "torch" not in self.seeded:
            states["torch"] = torch.default_generator.get_state()
        if "random" not in self.seeded:
            states["random"] = random.getstate()
        if "numpy" not in self.seeded:
            states["numpy"] = numpy.random.get_state()
        return states

    def moved(self, before: dict[str, Any]) -> set[str]:
        """The generators in ``before`` whose state changed since."""
        after = self.states()
        moved = set()
        for name, old in before.items():
            new = after[name]
            if name == "torch":
                same = torch.equal(old, new)
            elif name == "numpy":  # ('MT19937', keys, pos, has_gauss, cached_gaussian)
                same = old[0] == new[0] and bool((old[1] == new[1]).all()) and old[2:] == new[2:]
            else:
                same = old == new
            if not same:
                moved.add(name)
        return moved


DRAWS = Draws()


def seed_generators(names: set[str] | tuple[str, ...], seed: int) -> None:
    if "torch" in names:
        torch.default_generator.manual_seed(seed)  # (the CPU's only: not an accelerator's)
    if "random" in names:
        random.seed(seed)
    if "numpy" in names:
        numpy.random.seed(seed % (1 << 32))


def seeded_read(dataset: Any, collate: Collate, planned: Planned,
                draws: Draws = DRAWS) -> Any:
    """Read the batch, each sample under its seed for every generator reads were seen
    to draw from (read again once a generator is first seen to move), then collate
    under the batch's seed. Moves this process's random state (a worker's own)."""
    return seeded_reads(dataset, collate, [planned], draws)[0]


def seeded_reads(dataset: Any, collate: Collate, planned: Sequence[Planned],
                 draws: Draws = DRAWS) -> list[Any]:
    """``seeded_read`` of each batch, with one look at the generators for them all (a
    look costs about as much as reading a few samples)."""
    while True:
        before = draws.states()
        samples: list[list[Any]] = []
        for batch in planned:
            samples.append([])
            for offset, index in enumerate(batch.indices):
                if draws.seeded:
                    seed_generators(draws.seeded, sample_seed(batch.seed, batch.key.epoch,
                                                              batch.key.start + offset))
                samples[-1].append(dataset[index])
        moved = draws.moved(before)
        if not moved:
            break
        draws.seeded |= moved  # read again: those draws were not seeded
    out = []
    for batch, read in zip(planned, samples, strict=True):
        seed_generators(GENERATORS, batch_seed(batch.seed, batch.key))
        out.append(collate(read))
    return out


def read_batch(dataset: Any, collate: Collate, planned: Planned) -> Any:
    """``seeded_read`` in this process, its random state put back afterwards."""
    return read_batches(dataset, collate, [planned])[0]


def read_batches(dataset: Any, collate: Collate, planned: Sequence[Planned]) -> list[Any]:
    """``seeded_reads`` in this process, its random state put back afterwards (once for
    them all: saving it costs more than reading a few samples)."""
    kept = torch.default_generator.get_state(), random.getstate(), numpy.random.get_state()
    try:
        return seeded_reads(dataset, collate, planned)
    finally:
        torch.default_generator.set_state(kept[0])
        random.setstate(kept[1])
        numpy.random.set_state(kept[2])


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
        return read_batch(self._dataset, self._collate, wanted)

    def close(self) -> None:
        return None
