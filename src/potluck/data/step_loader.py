"""The step loader: always this rank's part of the step the cursor points at.

Unlike a prefetching loader it reads the cursor and the current membership afresh
before every step, so the user's ordinary ``for batch in loader`` loop redoes a failed
step for free: the cursor did not advance (nothing committed), the membership changed,
and the same slice of the epoch is split again among the survivors. Iteration ends at
the end of the cursor's current epoch. Each rank's part is its share of the block
(``shares(world_size)``: a share policy's, equal by default).

Under a sync strategy (DiLoCo) a step is a round: the block is the round's samples,
handed out in the strategy's ``segments(block)`` (one, or an even start and the rest:
each split by the shares as they stand when the loader gets to it, so a strategy can
measure speeds in between), and this rank's part of each comes as
``inner_steps(part, segment)`` batches (positions in the epoch permutation), one per
local optimizer step; the cursor commits once, after the round's last one.

Each sample is read under a seed of its own (``fetch.py``), in this process or, with
``workers=K``, ahead in K worker processes (``workers.py``): at each batch the loader
names the batches it expects next (the next ``prefetch`` steps, or local steps of the
segment, as the cursor, membership and shares stand), and any other batch it is asked
for is read here at once. The batch handed out is always the one the cursor points at.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import default_collate

from potluck.data.cursor import DataCursor
from potluck.data.fetch import BatchKey, Fetcher, InProcess, Planned, read_batch, read_batches
from potluck.data.handout import Handout, units_of
from potluck.data.memory import MemoryCap
from potluck.data.permutation import epoch_permutation
from potluck.data.split import check_rank, equal_shares, split_block, split_counts
from potluck.data.state import CursorState
from potluck.data.workers import WorkerPool
from potluck.errors import ConfigError, CursorError

# the samples a rank sitting out reads a step (or trains a round): two, as batch norm
# in train mode refuses a batch of one (its quarantine would crash the loop)
SIT_OUT = 2

Membership = Callable[[], tuple[int, int]]  # () -> (rank, world_size), read every step
# (samples, weight, total weight or None) of this rank's part: reducer.Contribution.set
Contribute = Callable[[int, float, "float | None"], None]
# (this rank's part, the segment of the round), as [start, stop) positions in the
# epoch permutation, and the members whose work counts (None: all) -> its local steps
InnerSteps = Callable[[tuple[int, int], tuple[int, int], "int | None"], int]
# a round's block -> the segments it is handed out in
Segments = Callable[[tuple[int, int]], Sequence[tuple[int, int]]]


class StepLoader:
    """Yields ``collate([dataset[i] for i in this rank's indices])`` step by step."""

    def __init__(self, dataset: Any, cursor: DataCursor, membership: Membership, *,
                 collate: Callable[[list[Any]], Any] | None = None,
                 shares: Callable[[int], Sequence[float]] = equal_shares,
                 max_repeats: int = 100, stop: Callable[[], bool] | None = None,
                 contribution: Contribute | None = None,
                 weight: Callable[[Any], float] | None = None,
                 memory: MemoryCap | None = None,
                 inner_steps: InnerSteps | None = None,
                 segments: Segments | None = None,
                 redone: Callable[[], int] | None = None,
                 workers: int = 0, prefetch: int = 2, read_timeout: float | None = None,
                 place: Callable[[Any], Any] | None = None,
                 sitting_out: Callable[[int], Collection[int]] | None = None,
                 handout: Handout | None = None) -> None:
        """``contribution`` hears each step's part (samples, or ``weight(batch)`` units
        such as real tokens) for the exact average; ``memory`` is this rank's micro-batch
        cap (``loader.memory``; ``loader.micro_batches``: how many its part takes);
        ``inner_steps`` into how many batches of a round, ``segments`` in which pieces
        the round is handed out (a sync strategy's; both or neither); ``redone``: how
        many steps the step transaction gave up and redoes, so far (``prepare``'s: the
        same step handed out again without one more is a loop bug, refused at once;
        without it, after ``max_repeats`` hand-outs). ``workers``: processes reading the
        next ``prefetch`` batches ahead (0: each is read here when asked for), a batch
        a worker reads waited for ``read_timeout`` seconds at most (None: as long as it
        takes); ``place(batch)``: in this process, after the read (e.g. to the device).
        ``sitting_out(world_size)``: ranks whose gradients count for nothing (quarantined
        by trust on a fixed cohort): the others share the whole step, so every sample is
        still trained once, and such a rank reads the step's first ``SIT_OUT`` samples
        only, so its loop still runs the step's collectives (under rounds it is handed
        ``SIT_OUT`` samples of each part of the round, its own: the parts must tile the
        round's block, and the others' local steps are those of a cohort without it).
        ``handout``: where it writes what it handed out (the split, the batches), for
        parts built before it."""
        check_workers(workers, prefetch, read_timeout)
        if (inner_steps is None) != (segments is None):
            given = "inner_steps" if segments is None else "segments"
            raise ConfigError(f"StepLoader got {given}= alone: a round needs both "
                              "inner_steps= and segments= (a sync strategy's: "
                              "inner_steps=strategy.inner_steps, segments=strategy.segments), "
                              "or neither")
        self.dataset, self.cursor, self.membership = dataset, cursor, membership
        self.shares = shares
        self.contribution, self.weight = contribution, weight
        self.memory = memory or MemoryCap()
        self._inner_of, self._segments_of = inner_steps, segments
        self._part = 1  # samples of this rank's part of the step last handed out
        self.handout = handout or Handout()
        self.segment = 0  # under a sync strategy: which segment of its round (from 0)
        self._handed: tuple[CursorState, Sequence[float]] | None = None  # its cursor state, shares
        self.stop = stop or (lambda: False)  # e.g. lambda: optimizer.left
        self.collate = collate or default_collate
        self.max_repeats = max_repeats  # the same step yielded this often: a loop bug
        self._redone = redone
        self.workers, self.prefetch = workers, prefetch
        self.fetcher: Fetcher = (WorkerPool(dataset, self.collate, workers, read_timeout)
                                 if workers else InProcess(dataset, self.collate))
        self._place = place or (lambda batch: batch)
        self._sitting_out = sitting_out or (lambda world_size: ())
        self._later: tuple[tuple[int, int], torch.Tensor] | None = None  # another epoch's order

    @property
    def split(self) -> list[int]:
        """Samples per rank of the step (or round segment) last handed out."""
        return self.handout.split

    @property
    def batches(self) -> int:
        """Batches handed out so far (a ``step()`` without one is a loop bug)."""
        return self.handout.batches

    @property
    def micro_batches(self) -> int:
        """How many micro-batches this rank's part of the step last handed out takes
        under its memory cap (as the cap stands now: ``fit_backward`` may lower it)."""
        return self.memory.micro_batches(self._part)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (the cursor's committed epoch)."""
        return self.cursor.epoch

    def __len__(self) -> int:
        """Steps in an epoch (batches a ``for`` over the loader yields from an epoch's
        start), as ``len()`` of a DataLoader: for ``OneCycleLR(total_steps=...)`` and
        progress bars. Under a sync strategy a round's batches follow each worker's
        measured speed, so there is no such number: ``loader.cursor.state
        .steps_per_epoch`` rounds."""
        if self._inner_of is not None:
            raise TypeError(
                "len() of a loader under sync=DiLoCo(...): each worker's batches in a "
                "round follow its measured speed; rounds per epoch are "
                "loader.cursor.state.steps_per_epoch")
        return self.cursor.state.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """DistributedSampler's call, for scripts that make it every epoch: the loader
        reshuffles by itself (the cursor's seeded permutation of each epoch), so this
        only checks that ``epoch`` is the loader's."""
        if epoch != self.cursor.epoch:
            raise ConfigError(
                f"set_epoch({epoch}): the loader is at epoch {self.cursor.epoch} and moves "
                "on by itself after an epoch's last step (a fresh seeded permutation each "
                "epoch); drop the call, or loop `while loader.epoch < epochs: for batch in "
                "loader: ...`")

    def __iter__(self) -> Iterator[Any]:
        epoch = self.cursor.epoch
        last, repeats = None, 0
        redone = self._redone() if self._redone is not None else None
        while self.cursor.epoch == epoch and not self._epoch_done() and not self.stop():
            state = self.cursor.state
            repeats = repeats + 1 if state == last else 0
            before, redone = redone, self._redone() if self._redone is not None else None
            # (a round's steps are counted by its sync strategy, which says more)
            if repeats and redone is not None and redone == before and self._inner_of is None:
                raise CursorError(
                    f"the loader was asked for the next batch, but the step at sample "
                    f"{state.cursor} of epoch {state.epoch} it handed out last was neither "
                    "committed nor failed: the loader hands out each step's batch until "
                    "opt.step() commits it, so the loop would train on it again. Call "
                    "opt.step() once per batch; to accumulate gradients over several "
                    "micro-batches, split the step's batch: for part, weight in "
                    "potluck.accumulate(model, batch, k): (loss(part) * weight).backward() "
                    "(docs/data-parallel.md)")
            if repeats > self.max_repeats:
                raise CursorError(
                    f"step at sample {state.cursor} of epoch {state.epoch} was handed out "
                    f"{repeats} times without a commit: call the optimizer's step() "
                    "(potluck.prepare's, or cursor.commit()) once per batch; if the loop "
                    "does, every attempt at this step failed (the log's 'step abandoned' "
                    "warnings say why)"
                )
            last = state
            rank, world_size = self.membership()
            start, stop = state.block
            shares = self._shares_for(stop - start, world_size)
            self._handed = (state, shares)
            self.handout.handed(split_counts(stop - start, shares), self.part_of,
                                self.read_ranges)
            check_rank(rank, world_size)
            part = split_block(start, stop, shares)[rank]
            if not part and stop > start and rank in self._sitting_out(world_size):
                # sitting out: a read, counted for nothing (samples another rank trains)
                part = range(start, min(stop, start + SIT_OUT))
            if part.stop <= part.start:
                raise CursorError(
                    f"rank {rank} of {world_size} has no sample in the step at sample "
                    f"{state.cursor} (a block of {len(self.cursor.global_indices())}); every "
                    "rank must train on at least one sample per step: use a global batch "
                    "of at least the world size, and drop_last=True (potluck.prepare's or "
                    "DataCursor's) where an epoch's last step is shorter"
                )
            if self._inner_of is not None:
                yield from self._round(state, rank, world_size, shares)
                continue
            batch = self._fetch(self._planned(state.epoch, part.start, part.stop),
                                self._ahead(state, rank, world_size, shares))
            self._part = len(part)
            if self.contribution is not None:
                self._contribute(batch, self.split[rank], stop - start)
            self.handout.batch()
            yield batch

    def part_of(self, rank: int) -> Any:
        """``rank``'s batch of the step last handed out (what it trained on: a spot
        check recomputes its gradient, ``potluck.trust``)."""
        if self._handed is None:
            raise CursorError("part_of(): no step was handed out yet")
        state, shares = self._handed
        part = split_block(*state.block, shares)[rank]
        wanted = self._planned(state.epoch, part.start, part.stop)
        return self._place(read_batch(self.dataset, self.collate, wanted))

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[Any]:
        """The batches of positions ``[start, stop)`` of each range, in the epoch of the
        step last handed out, read here as a worker reads them (each sample under its
        own seed; this process's random state saved and put back once)."""
        if self._handed is None:
            raise CursorError("read_ranges(): no step was handed out yet")
        epoch = self._handed[0].epoch
        wanted = [self._planned(epoch, start, stop) for start, stop in ranges]
        return [self._place(b) for b in read_batches(self.dataset, self.collate, wanted)]

    def close(self) -> None:
        """Stop the worker processes, if any (they also stop with this process)."""
        self.fetcher.close()

    def _round(self, state: CursorState, rank: int, world_size: int,
               shares: Sequence[float]) -> Iterator[Any]:
        """This rank's part of a round, segment by segment, one batch per local step
        (contiguous within a segment, equal within one sample). A later segment's shares
        are asked for when the loader gets to it: after the earlier ones' local steps."""
        assert self._inner_of is not None and self._segments_of is not None
        for k, (start, stop) in enumerate(self._segments_of(state.block)):
            if k:
                shares = self._shares_for(stop - start, world_size)
            self.handout.segment(split_counts(stop - start, shares))
            self.segment = k
            part = split_block(start, stop, shares)[rank]
            if part.stop <= part.start:
                raise CursorError(
                    f"rank {rank} of {world_size} has no sample in positions [{start}, "
                    f"{stop}) of the round at sample {state.cursor}: every rank must train "
                    "on at least one sample of each part of a round; use a global batch "
                    "of at least the world size")
            out = set(self._sitting_out(world_size)) & set(range(world_size))
            steps = self._inner_of((part.start, part.stop), (start, stop),
                                   world_size - len(out) if out else None)
            counts = split_counts(len(part), equal_shares(steps))
            firsts = itertools.accumulate(counts, initial=part.start)  # (one too many)
            batches = [self._planned(state.epoch, first, first + count)
                       for first, count in zip(firsts, counts, strict=False)]
            for j, count in enumerate(counts):
                self._part = count
                self.handout.batch()
                ahead = batches[j + 1:j + 1 + self.prefetch] if self.workers else []
                yield self._fetch(batches[j], ahead)

    def _shares_for(self, block: int, world_size: int) -> Sequence[float]:
        """The policy's shares, fitted to the block (``_fitted``)."""
        shares = self.shares(world_size)
        if len(shares) != world_size:
            raise ConfigError(
                f"the share policy gave {len(shares)} shares ({list(shares)}) for a cohort of "
                f"{world_size}: a share policy's shares(world_size) returns one weight per "
                "rank of the current membership")
        out = set(self._sitting_out(world_size)) & set(range(world_size))
        if out and len(out) < world_size and self._inner_of is not None:
            return _one_each(shares, block, out)
        if out and len(out) < world_size:
            shares = [0.0 if r in out else float(s) for r, s in enumerate(shares)]
            if not any(shares):  # (the policy gave the rest nothing: equal among them)
                shares = [0.0 if r in out else 1.0 for r in range(world_size)]
        return _fitted(shares, block, world_size, out)

    def _fetch(self, wanted: Planned, ahead: list[Planned]) -> Any:
        return self._place(self.fetcher.get(wanted, ahead))

    def _planned(self, epoch: int, start: int, stop: int) -> Planned:
        """The batch of positions ``[start, stop)`` of epoch ``epoch``."""
        return Planned(BatchKey(epoch, start, stop), self._order(epoch)[start:stop].tolist(),
                       self.cursor.state.seed)

    def _ahead(self, state: CursorState, rank: int, world_size: int,
               shares: Sequence[float]) -> list[Planned]:
        """This rank's batches of the ``prefetch`` steps after ``state``'s, should each
        commit whole with the membership and shares as they are (none without
        workers: nothing reads ahead)."""
        planned: list[Planned] = []
        for _ in range(self.prefetch if self.workers else 0):
            state = state.advanced()
            start, stop = state.block
            out = set(self._sitting_out(world_size))
            part = split_block(start, stop, _fitted(shares, stop - start, world_size, out))[rank]
            if part.stop > part.start:
                planned.append(self._planned(state.epoch, part.start, part.stop))
        return planned

    def _order(self, epoch: int) -> torch.Tensor:
        """Epoch ``epoch``'s permutation: the cursor's for its own epoch, and one other
        kept here (the next, read ahead into), so the cursor's is never evicted."""
        if epoch == self.cursor.epoch:
            return self.cursor.permutation(epoch)
        state = self.cursor.state
        if self._later is None or self._later[0] != (state.seed, epoch):
            self._later = ((state.seed, epoch),
                           epoch_permutation(state.dataset_len, state.seed, epoch))
        return self._later[1]

    def _contribute(self, batch: Any, samples: int, block: int) -> None:
        assert self.contribution is not None
        if self.weight is None:
            self.contribution(samples, float(samples), float(block))
            return
        self.contribution(samples, units_of(self.weight, batch), None)

    def _epoch_done(self) -> bool:
        return not self.cursor.global_indices()


def _one_each(shares: Sequence[float], block: int, out: Collection[int]) -> list[float]:
    """Under rounds, shares that give each rank sitting ``out`` ``SIT_OUT`` samples of the
    block and the others the rest by ``shares`` (one, then equal shares, where that
    would leave another rank without a sample; one each, where the block is shorter): a
    round's parts tile its block, and every member takes part in the round's sync (a
    quarantined member's copy counts for nothing: its samples are lost, not its whole
    share)."""
    kept = [0.0 if r in out else float(s) for r, s in enumerate(shares)]
    equal = [0.0 if r in out else 1.0 for r in range(len(shares))]
    # (the policy's shares, else equal ones: each trusted rank must get a sample)
    for each, weights in ((SIT_OUT, kept), (1, kept), (1, equal)):
        rest = block - each * len(out)
        if rest < 1 or not any(weights):
            continue
        counts = split_counts(rest, weights)
        if all(c > 0 for r, c in enumerate(counts) if r not in out):
            return [float(each) if r in out else float(c) for r, c in enumerate(counts)]
    return [1.0] * len(shares)


def _fitted(shares: Sequence[float], block: int, world_size: int,
            out: Collection[int] = ()) -> Sequence[float]:
    """``shares``, or equal ones (among the ranks not sitting ``out``) for a short last
    block of an epoch that they would leave a rank without a sample (the same decision
    on every rank)."""
    counts = split_counts(block, shares)
    if block >= world_size - len(out) and any(c == 0 for r, c in enumerate(counts)
                                              if r not in out):
        return [0.0 if r in out else 1.0 for r in range(world_size)] if out else \
            equal_shares(world_size)
    return shares


def check_workers(workers: object, prefetch: object, read_timeout: object = None) -> None:
    """``num_workers``, ``prefetch`` and ``read_timeout`` as ``prepare`` and
    ``StepLoader`` take them."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ConfigError(f"num_workers={workers!r} must be an int >= 0: worker processes "
                          "that read the next steps' batches ahead (0: read each in the "
                          "training process when the loop asks for it), e.g. num_workers=4")
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise ConfigError(f"prefetch={prefetch!r} must be an int >= 1: how many steps' "
                          "batches the worker processes read ahead, e.g. prefetch=2")
    if read_timeout is None:
        return
    if (isinstance(read_timeout, bool) or not isinstance(read_timeout, numbers.Real)
            or not float(read_timeout) > 0):
        raise ConfigError(f"read_timeout={read_timeout!r} must be a positive number of "
                          "seconds a worker's batch is waited for, or None (as long as it "
                          "takes), e.g. read_timeout=120")
    if not workers:
        raise ConfigError(f"read_timeout={read_timeout!r} with num_workers=0: a read in the "
                          "training process cannot be cut short; pass num_workers >= 1 "
                          "(the batch is then read in a worker and waited for that long) "
                          "or drop read_timeout")
