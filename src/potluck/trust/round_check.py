"""``WorkCheck``: the I/O of the work check under rounds (the rule: ``round_work.py``).

On a round it checks, trust's round sum hands it, per piece, every target's whole
pseudo-gradient as the slices' owners decoded it (``keep``): each owner adds its copy
of the targets' slices to the aggregate it hands out, so no collective of its own
moves them. It copies the piece's global parameters then, which are still the round's
start. After the round committed (``measure``), on every member (each measures only
what a median reads: not its own row as a target, nothing where it owns no slice):

1. **targets**: the round's targets' pseudo-gradients, kept;
2. **evaluate**: on a functional copy of the model (``torch.func.functional_call``,
   in eval mode, its buffers copied, under ``torch.random.fork_rng``, without
   gradients), the loss at the round's start
   and at ``start - delta`` of each target, on each member's sample of the round (a
   run of ``RoundCheck.samples`` of its positions, drawn from a hash of the round's
   reports, read as the loader reads them);
3. **exchange**: one all-gather of every member's gains (``[targets, members]``
   float64), of which each gain is the median over the checkers other than the target;
   the fingerprint of each member's global parameters rides with them when it is due;
   so does each member's z-score of each pair flagged as copies (``round_copy``: the
   shared pseudo-gradient against the other targets' mean, chunk by chunk, on up to
   ``RoundCheck.copy_samples`` positions of each of the two parts), of which each
   is the median over the checkers outside the pair;
4. **remember**: the trust part scores the round (``round_work.work_scores``) and the
   check keeps each member's last ``WINDOW`` scores by member id (``remember``), the
   window the rule judges.

Bytes a member sends on a checked round: the targets' slices as they reached it,
``(N - 1) * T / N`` of the pseudo-gradient (T targets; every member each
``RoundCheck.every`` rounds: ``N - 1`` pseudo-gradients, encoded by the round's codec;
in the round sum's second all-to-all), plus ``8 * T * N * (N - 1)`` bytes of gains.
Forward passes: ``N * (T + 1)`` of ``samples`` samples each on a member that is not a
target, ``N * T`` on one that is (its own row is not read: the median leaves it out,
so it is not measured; a member that owns no slice measures nothing); and on a round
with a copied pair, 4 more of ``copy_samples`` samples for the pair, on each checker
outside it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from potluck.collectives import settle
from potluck.errors import ConfigError
from potluck.group import ProcessGroupLike
from potluck.sync.round_sum import Piece
from potluck.trust.round_copy import chunks, pair_z
from potluck.trust.round_work import (
    WINDOW,
    RoundCheck,
    median_gains,
    outside,
    round_seed,
    windows,
)
from potluck.trust.verdict import median

Pair = tuple[int, int]

# runs [start, stop) of positions of the round's epoch -> their batches, read at once
ReadRange = Callable[[Sequence[tuple[int, int]]], list[Any]]


@dataclass
class _Kept:
    """One piece of a checked round: its parameters, their start values (flat), the
    owners then, the targets and each target's whole pseudo-gradient of the piece."""

    members: tuple[int, ...]
    start: torch.Tensor
    owners: tuple[int, ...]
    targets: tuple[int, ...]
    deltas: list[torch.Tensor]


@dataclass(frozen=True)
class Measured:
    """A checked round: the median gains ``[target][member]``, every member's word
    carried with them (None: none was), and each pair's z-score (``round_copy``)."""

    gains: list[list[float]]
    carried: list[int] | None
    paired: list[float]


class WorkCheck:
    """Made by ``RoundTrustPart``; ``keep`` is called by its round sum."""

    def __init__(self, config: RoundCheck, module: nn.Module,
                 global_parameters: Callable[[], Sequence[torch.Tensor]],
                 read_range: ReadRange) -> None:
        self.config, self._module = config, module
        self._global, self._read = global_parameters, read_range
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        self._names = [name for name, _ in named]
        self._kept: dict[str, _Kept] = {}
        self._parts: tuple[tuple[tuple[int, int], ...], ...] = ()
        self._round = 0
        self.forced: set[str] = set()  # members checked next round whatever ``every``
        self._recent: dict[str, deque[float]] = {}  # each member's last scores
        self._paired: dict[tuple[str, str], list[float]] = {}  # each pair's z-scores

    def remember(self, scores: Mapping[str, float]) -> dict[str, list[float]]:
        """This round's score of each member checked (by member id; NaN: none this
        round); each one's last ``WINDOW`` scores, the newest last. A member keeps its
        scores across memberships: they are its own work's."""
        for member, score in scores.items():
            if not math.isnan(score):
                self._recent.setdefault(member, deque(maxlen=WINDOW)).append(score)
        return {member: list(self._recent.get(member, ())) for member in scores}

    def remember_pairs(self, scores: Mapping[tuple[str, str], float]
                       ) -> dict[tuple[str, str], list[float]]:
        """This round's z-score of each copied pair (by member ids, in the order the
        z-score reads them); each pair's first ``WINDOW`` measured ones (NaN: not
        measured this round, not kept). The data looks no more after those: each look
        is one more chance for a false strike (``round_copy``)."""
        for pair, z in scores.items():
            kept = self._paired.setdefault(pair, [])
            if math.isfinite(z) and len(kept) < WINDOW:
                kept.append(z)
        return {pair: list(self._paired[pair]) for pair in scores}

    def due(self, round_: int) -> bool:
        """Whether round ``round_`` is checked (its copies kept)."""
        return bool(self.forced) or round_ % self.config.every == 0

    def keep(self, piece: Piece, owners: tuple[int, ...], targets: tuple[int, ...],
             deltas: Sequence[torch.Tensor]) -> None:
        """For each piece of a round that is checked: the ``targets``' whole
        pseudo-gradients of it (``deltas``, in targets' order)."""
        if not self.due(piece.round) or not targets:
            return
        if piece.round != self._round:
            self._kept, self._parts, self._round = {}, (), piece.round
        values = self._global()
        start = torch.cat([values[i].detach().reshape(-1) for i in piece.members]).clone()
        kept = [d.detach().to(piece.delta.dtype).clone() for d in deltas]
        self._kept[piece.key] = _Kept(piece.members, start, owners, targets, kept)
        if piece.parts:
            self._parts = piece.parts

    def forget(self) -> None:
        """A new membership, or a round not measured: what was kept goes."""
        self._kept, self._parts, self._round = {}, (), 0

    def measure(self, round_: int, targets: Sequence[int], digest: bytes,
                group: ProcessGroupLike, device: torch.device,
                carry: int | None = None, pairs: Sequence[Pair] = ()) -> Measured | None:
        """The median gains ``[target][member]`` of round ``round_``'s ``targets``
        (ranks that owned slices); None where the round was not kept whole. ``carry``:
        a 64-bit word of this member's that rides with its gains (the fingerprint of
        its global parameters: one collective less a round); every member's comes back
        in ``Measured.carried``. ``pairs``: the ranks of each pair flagged as copies;
        their z-scores come back in ``Measured.paired`` (NaN: cannot tell)."""
        kept, parts, kept_round = self._kept, self._parts, self._round
        self.forget()
        n = group.size()
        # (the same answer on every member: each keeps the same pieces of a checked round)
        if not kept or kept_round != round_ or len(parts) != n or any(
                k.targets != tuple(targets) for k in kept.values()):
            return None
        deltas = [k.deltas for k in kept.values()]
        picked = windows(parts, self.config.samples, round_seed(round_, digest))
        owners, me = next(iter(kept.values())).owners, group.rank()
        needed = [t for t, target in enumerate(targets) if me in outside(owners, (target,))]
        gains = torch.tensor(self._gains(kept, deltas, picked, needed), dtype=torch.float64)
        seed = round_seed(round_, digest + b"copies")
        mine_z = [self._pair(kept, parts, targets, pair, seed)
                  if me in outside(owners, pair) else math.nan for pair in pairs]
        words = torch.cat([gains.reshape(-1), torch.tensor(mine_z, dtype=torch.float64)])
        if carry is not None:  # (its bits, as a float64: the gains' dtype)
            words = torch.cat([words, torch.tensor([carry], dtype=torch.int64)
                               .view(torch.float64)])
        mine = words.to(device)
        table = [torch.zeros_like(mine) for _ in range(n)]
        _all_gather(group, table, mine, "the work check's gains")
        rows = [t.cpu() for t in table]
        gathered = [r[:gains.numel()].view(gains.shape).tolist() for r in rows]
        carried = None if carry is None else [int(r[-1:].view(torch.int64)) for r in rows]
        paired = []
        for k, pair in enumerate(pairs):
            values = [float(rows[c][gains.numel() + k]) for c in outside(owners, pair)]
            known = [v for v in values if math.isfinite(v)]
            paired.append(median(known) if known else math.nan)
        return Measured(median_gains(gathered, owners, targets), carried, paired)

    def _pair(self, kept: dict[str, _Kept], parts: Sequence[Sequence[tuple[int, int]]],
              targets: Sequence[int], pair: Pair, seed: int) -> float:
        """This member's z-score of ``pair``: how much better the pair's shared
        pseudo-gradient does than the other targets' mean, chunk by chunk, on the
        first member's part over the second's (NaN: a member of the pair not a target
        this round, or no other target)."""
        if not all(r in targets for r in pair) or len(targets) < 3:
            return math.nan
        a, b = (targets.index(r) for r in pair)
        rest = [t for t in range(len(targets)) if t not in (a, b)]
        pieces = list(kept.values())
        shared = self._state(pieces, [p.start - (p.deltas[a] + p.deltas[b]) / 2
                                      for p in pieces])
        reference = self._state(pieces, [p.start - sum(p.deltas[t] for t in rest) / len(rest)
                                         for p in pieces])
        sides = [chunks(runs) for runs in
                 windows([parts[r] for r in pair], self.config.copy_samples, seed)]
        read = iter(self._read([c for side in sides for c in side]))
        batches = [[next(read) for _ in side] for side in sides]
        first = pieces[0].start
        with torch.random.fork_rng(devices=[first.device] if first.is_cuda else []), \
                torch.no_grad():
            values = [[self._loss(reference, [x]) - self._loss(shared, [x]) for x in side]
                      for side in batches]
        return pair_z(values[0], values[1])

    def _gains(self, kept: dict[str, _Kept], deltas: list[list[torch.Tensor]],
               picked: Sequence[Sequence[tuple[int, int]]], rows: Sequence[int]
               ) -> list[list[float]]:
        """``[target][member]``: the loss at the start minus at ``start - delta``, for
        the targets in ``rows`` (the others' rows NaN: nobody reads this member's)."""
        pieces = list(kept.values())
        targets = len(deltas[0]) if deltas else 0
        if not rows:
            return [[math.nan] * len(picked) for _ in range(targets)]
        start = self._state(pieces, [p.start for p in pieces])
        read = iter(self._read([run for runs in picked for run in runs]))
        batches = [_joined([next(read) for _ in runs]) for runs in picked]
        first = pieces[0].start
        devices = [first.device] if first.is_cuda else []
        gains = []
        # (one fork for every loss: forking costs milliseconds, a small forward less)
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            before = [self._loss(start, runs) for runs in batches]
            for t in range(targets):
                if t not in rows:
                    gains.append([math.nan] * len(batches))
                    continue
                moved = self._state(pieces, [p.start - d[t] for p, d in zip(pieces, deltas,
                                                                             strict=True)])
                gains.append([b - self._loss(moved, runs)
                              for b, runs in zip(before, batches, strict=True)])
        return gains

    def _state(self, pieces: Sequence[_Kept], flats: Sequence[torch.Tensor]
               ) -> dict[str, torch.Tensor]:
        """The module's parameters and buffers by name, the kept ones from ``flats``."""
        # (copies: a module may write a buffer in its forward, and the check must not
        # change the model)
        state = {name: b.detach().clone() for name, b in self._module.named_buffers()}
        state.update({name: p.detach() for name, p in self._module.named_parameters()})
        for piece, flat in zip(pieces, flats, strict=True):
            at = 0
            for i in piece.members:
                name = self._names[i]
                like = state[name]
                state[name] = flat[at:at + like.numel()].view_as(like).to(like.dtype)
                at += like.numel()
        return state

    def _loss(self, state: dict[str, torch.Tensor], runs: Sequence[Any]) -> float:
        """The mean loss over the runs' batches (NaN: none); called under a forked RNG,
        without gradients."""
        if not runs:
            return math.nan
        module = self._module

        def model(*args: Any, **kwargs: Any) -> Any:
            return torch.func.functional_call(module, state, args, kwargs)

        total = 0.0
        with evaluating(module):
            for batch in runs:
                value = self.config.loss(model, batch)
                if not (isinstance(value, torch.Tensor) and value.numel() == 1):
                    raise ConfigError(f"RoundCheck's loss(model, batch) returned "
                                      f"{type(value).__name__}; it must return the scalar "
                                      "loss the loop calls backward() on")
                total += float(value)
        return total / len(runs)


@contextmanager
def evaluating(module: nn.Module) -> Iterator[None]:
    """``module`` in eval mode, as a validation loss is taken (no dropout: its masks
    are noise the gains would carry; batch norm on its running statistics, which it
    does not update), each submodule's own mode back after."""
    modes = [(m, m.training) for m in module.modules()]
    try:
        module.eval()
        yield
    finally:
        # (each flag set back as it was: ``train()`` recurses, so a submodule shared by
        # two parents, or a frozen child, would take its last parent's mode)
        for m, training in modes:
            m.training = training


def _all_gather(group: ProcessGroupLike, into: list[torch.Tensor], mine: torch.Tensor,
                what: str) -> None:
    settle(lambda: group.allgather([into], [mine]), group, what)


def _joined(batches: list[Any]) -> list[Any]:
    """The runs' batches as one (one forward instead of one a run) where each is a
    tensor, or a tuple, list or dict of them with the same structure; else as they are."""
    if len(batches) < 2:
        return batches
    joined = _cat(batches)
    return batches if joined is None else [joined]


def _cat(batches: list[Any]) -> Any:
    first = batches[0]
    if isinstance(first, torch.Tensor):
        ok = all(isinstance(b, torch.Tensor) and b.dim() > 0 and b.shape[1:] == first.shape[1:]
                 for b in batches) and first.dim() > 0
        return torch.cat(batches) if ok else None
    if isinstance(first, (tuple, list)):
        if not all(type(b) is type(first) and len(b) == len(first) for b in batches):
            return None
        parts = [_cat([b[i] for b in batches]) for i in range(len(first))]
        return None if any(p is None for p in parts) else type(first)(parts)
    if isinstance(first, dict):
        if not all(isinstance(b, dict) and b.keys() == first.keys() for b in batches):
            return None
        values = {k: _cat([b[k] for b in batches]) for k in first}
        return None if any(v is None for v in values.values()) else values
    return None
