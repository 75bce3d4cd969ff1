"""``Handout``: what the step loader handed out last, for the parts that read it.

The loader writes it each time it hands out a step (or a segment of a round); the step
transaction, the balancer, the observer and trust read it. It is made before any of
them, so none of them needs the loader itself: the loader is built last, from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from potluck.errors import ConfigError, CursorError

ReadPart = Callable[[int], Any]  # rank -> that rank's batch of the step handed out
# runs [start, stop) of positions of the step's epoch -> their batches
ReadRanges = Callable[[Sequence[tuple[int, int]]], list[Any]]


class Handout:
    """The split of the step last handed out, how many batches so far, and a way to read
    any rank's part of that step again (a spot check recomputes it)."""

    def __init__(self) -> None:
        self.split: list[int] = []  # samples per rank of the step (or segment) last handed out
        self.batches = 0  # batches handed out so far (a step() without one is a loop bug)
        self._read: ReadPart | None = None
        self._ranges: ReadRanges | None = None
        self._steps = 0  # steps handed out (a step handed out again counts again)

    def handed(self, split: Sequence[int], read: ReadPart,
               read_ranges: ReadRanges | None = None) -> None:
        """The loader hands out a step split so (``read(rank)``: that rank's batch;
        ``read_ranges(runs)``: the batches of any runs of positions of the step's
        epoch)."""
        self.split, self._read = list(split), read
        self._ranges = read_ranges if read_ranges is not None else self._ranges
        self._steps += 1

    def segment(self, split: Sequence[int]) -> None:
        """The loader hands out a segment of a round split so."""
        self.split = list(split)

    def batch(self) -> None:
        """The loader yields one more batch."""
        self.batches += 1

    def step_samples(self) -> int:
        """Samples of the step last handed out, all ranks together."""
        return sum(self.split)

    def samples_of(self, rank: int) -> tuple[int, int] | None:
        """``rank``'s samples and the step's, last handed out (None: no such rank)."""
        split = self.split
        return (split[rank], sum(split)) if 0 <= rank < len(split) else None

    def weighed(self, weight: Callable[[Any], float]) -> Callable[[], list[float]]:
        """Each rank's units of the step last handed out, ``weight`` of its batch, read
        here again: what its gradient weighs, never a number the rank claimed (trust
        under ``prepare(weight=...)``). A rank with no sample weighs 0. Read once a
        step: the function keeps its last answer until the next hand-out."""
        kept: list[Any] = [None, []]

        def units() -> list[float]:
            if kept[0] != self._steps:
                kept[:] = [self._steps, [units_of(weight, self.part_of(rank)) if count else 0.0
                                         for rank, count in enumerate(self.split)]]
            return list(kept[1])

        return units

    def part_of(self, rank: int) -> Any:
        """``rank``'s batch of the step last handed out (what it trained on)."""
        if self._read is None:
            raise CursorError("part_of(): no step was handed out yet")
        return self._read(rank)


    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[Any]:
        """The batches of runs ``[start, stop)`` of positions of the last step's epoch,
        read as the loader reads them (a round's check of work reads members' samples
        so, all at once)."""
        if self._ranges is None:
            raise CursorError("read_ranges(): no step was handed out yet")
        return self._ranges(ranges)


def units_of(weight: Callable[[Any], float], batch: Any) -> float:
    """``weight(batch)``, a batch's units (``prepare(weight=...)``), or the refusal that
    says what it must return."""
    try:
        units = float(weight(batch))
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"weight(batch) must return a number (e.g. the count of real tokens in "
            f"the batch), but it raised {type(exc).__name__}: {exc}") from exc
    if not (math.isfinite(units) and units >= 0):
        raise ConfigError(f"weight(batch) returned {units!r}: a batch's units must be a "
                          "finite number >= 0 (e.g. the count of real tokens in it)")
    return units
