"""The two checks of a data-parallel run: replicas equal, every sample exactly once.

``assert_replicas_equal`` takes the ranks' parameters (a state or a module each; None
for a rank that died) and wants them equal bit for bit: every rank applied the same
averaged update. A ``reference`` (one process on the same global batches) may differ
within ``rtol`` and ``atol``, since its sums ran in another order.

``assert_exactly_once`` takes the sample ids each rank trained on, by epoch, and wants
every sample of every epoch once. A ``SampleLedger`` writes one rank's ids to a file,
one line per committed step, flushed at once: a rank killed later leaves its ledger
whole. Pass the ledgers' directory, or ``(epoch, ids)`` records.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import torch
from torch import nn

Replica = Mapping[str, torch.Tensor] | nn.Module
Records = Iterable[tuple[int, Sequence[int]]]  # (epoch, sample ids of one step)


class SampleLedger:
    """The samples one rank trained on, in the file ``path`` (``*.jsonl``, one a rank in
    a directory): a line ``[epoch, ids]`` per committed step, appended and flushed."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = self.path.open("a")

    def record(self, epoch: int, samples: Iterable[int]) -> None:
        """The ids of a committed step (of a committed round, under DiLoCo)."""
        self._file.write(json.dumps([epoch, [int(i) for i in samples]]) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> SampleLedger:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


def read_ledgers(directory: str | Path) -> list[tuple[int, list[int]]]:
    """Every record of every ledger (``*.jsonl``) in ``directory``."""
    return [(int(epoch), list(ids)) for path in sorted(Path(directory).glob("*.jsonl"))
            for epoch, ids in (json.loads(line) for line in path.read_text().splitlines())]


def exactly_once_problems(trained: str | Path | Records, samples: int | Collection[int],
                          epochs: int = 1) -> list[str]:
    """Each epoch whose trained ids are not ``samples`` (``n``: ids ``0 .. n-1``) each
    once; empty when all are. ``trained``: a directory of ledgers, or records."""
    records = read_ledgers(trained) if isinstance(trained, (str, Path)) else list(trained)
    expected = set(range(samples)) if isinstance(samples, int) else set(samples)
    problems = []
    for epoch in range(epochs):
        counts = Counter(i for e, ids in records if e == epoch for i in ids)
        missing = sorted(expected - set(counts))
        twice = sorted(i for i, n in counts.items() if n > 1)
        extra = sorted(set(counts) - expected)
        if missing or twice or extra:
            problems.append(f"epoch {epoch}: missing {missing}, more than once {twice}"
                            + (f", not in the dataset {extra}" if extra else ""))
    later = sorted({e for e, _ in records if not 0 <= e < epochs})
    if later:
        problems.append(f"samples trained in epochs {later}, beyond the {epochs} expected")
    return problems


def assert_exactly_once(trained: str | Path | Records, samples: int | Collection[int],
                        epochs: int = 1) -> None:
    """Every sample of every epoch trained exactly once, over all ranks together."""
    problems = exactly_once_problems(trained, samples, epochs)
    if problems:
        raise AssertionError("not every sample exactly once: " + "; ".join(problems))


def assert_replicas_equal(replicas: Sequence[Replica | None], *,
                          reference: Replica | None = None, rtol: float = 0.0,
                          atol: float = 0.0) -> None:
    """The ranks' replicas (None: a rank that died) equal bit for bit, and ``reference``
    within ``rtol`` and ``atol``. A message names the ranks, the tensor and the gap."""
    states = {rank: _state(r) for rank, r in enumerate(replicas) if r is not None}
    if not states:
        raise AssertionError("no replica to compare: every rank's entry is None")
    first, base = next(iter(states.items()))
    for rank, state in states.items():
        if state.keys() != base.keys():
            raise AssertionError(f"rank {rank}'s replica has other tensors than rank "
                                 f"{first}'s: {sorted(state.keys() ^ base.keys())}")
        for name, value in state.items():
            if not torch.equal(value, base[name]):
                raise AssertionError(f"rank {rank}'s replica differs from rank {first}'s "
                                     f"in {name} (largest gap {_gap(value, base[name])})")
    if reference is None:
        return
    expected = _state(reference)
    for name, value in expected.items():
        if name not in base:
            raise AssertionError(f"the replicas have no {name}, which the reference has")
        if not torch.allclose(base[name], value, rtol=rtol, atol=atol):
            raise AssertionError(f"the replicas differ from the reference in {name} "
                                 f"(largest gap {_gap(base[name], value)}, rtol {rtol:g}, "
                                 f"atol {atol:g})")


def _state(replica: Replica) -> dict[str, torch.Tensor]:
    if isinstance(replica, nn.Module):
        return {n: p.detach() for n, p in replica.named_parameters()}
    return dict(replica)


def _gap(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape:
        return f"shapes {tuple(a.shape)} and {tuple(b.shape)}"
    return f"{float((a.double() - b.double()).abs().max()):.3g}"
