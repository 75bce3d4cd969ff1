"""Whether a member's pseudo-gradient is work on the data the round assigned it (pure).

A member trained its round on its own part of the round's block. So its pseudo-gradient
``delta`` must lower the loss on a sample of that part: the loss at the round's start
parameters minus the loss at ``start - delta`` (its *gain*) must be above 0. And it must
lower it there at least as much as on the other members' samples, within a tolerance:
a member that trained on other data, or sent another member's work, lowers the loss
more where that work was done.

``RoundCheck`` is the setting; ``windows`` picks each member's sample; ``judge_work``
and ``settle_copies`` turn the gains into findings. The I/O (the target's pseudo-
gradient gathered, the losses evaluated, the gains exchanged) is ``round_check.py``.

Every checker measures every target's gain on every member's sample. The gains are
exchanged, and each one is the median over the checkers other than the target, so
every honest member holds the same table and reaches the same verdict, and one lying
checker can neither accuse nor acquit anyone.

The rules, for a checked member ``t`` (its *own* gain: on its sample; *others'*: the
mean of its gains on the other members' samples; ``scale``: the median checked
member's own gain, for its part):

- its own gain is not above 0: its pseudo-gradient does not lower the loss on its data
  (a free rider's zero, a sign flip, an inner product attack, training on wrong labels);
- its own gain is under its others' gain minus ``tolerance * scale`` (trained on
  other data).

A scaled-down copy of real work still lowers the loss on its own data most: the free
rider rule of ``round_rules`` (on the norm) catches it. A measured gain is noisy (a few
tens of samples), too noisy to be held to a fraction of the median member's.

A pair that ``round_rules`` flags as copies sent (nearly) the same pseudo-gradient, so
it lowers the loss more on the samples of the member that did the work.
``settle_copies`` strikes the other one only, when the difference is over the
tolerance.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from potluck.errors import ConfigError
from potluck.trust.spot import Loss
from potluck.trust.verdict import COPIED, NO_WORK, Finding, median

Range = tuple[int, int]
RUNS = 8  # runs of positions a member's sample is read in


@dataclass(frozen=True)
class RoundCheck:
    """``Trust(round_check=RoundCheck(loss))``: check under rounds that each member's
    pseudo-gradient is work on its own data.

    ``loss(model, batch)``: the scalar the loop calls ``backward()`` on, as for
    ``SpotCheck``; it must be deterministic given the parameters and the batch.
    ``samples``: positions of each member's part of the round read for its sample (in
    runs spread over the part, at offsets drawn after the round). ``every``: every member is
    checked every K rounds (and a pair flagged as copies the round after).
    ``tolerance``: how much more, relative to the median member's gain on its own data,
    a member's pseudo-gradient may lower the loss on the others' samples than on its own.
    """

    loss: Loss
    samples: int = 64
    every: int = 1
    tolerance: float = 0.5

    def __post_init__(self) -> None:
        if not callable(self.loss):
            raise ConfigError(f"RoundCheck(loss={self.loss!r}) must be a callable "
                              "loss(model, batch) -> scalar tensor")
        if not _count(self.samples) or self.samples < 1:
            raise ConfigError(f"RoundCheck(samples={self.samples!r}) must be an int >= 1 "
                              "(positions of each member's part read for its sample), e.g. 64")
        if not _count(self.every) or self.every < 1:
            raise ConfigError(f"RoundCheck(every={self.every!r}) must be an int >= 1 (every "
                              "member is checked every K rounds), e.g. 1")
        if (isinstance(self.tolerance, bool) or not isinstance(self.tolerance, (int, float))
                or not 0 <= self.tolerance < 10):
            raise ConfigError(f"RoundCheck(tolerance={self.tolerance!r}) must be a number in "
                              "[0, 10): the others' gain over a member's own, relative to "
                              "the median member's own gain, that still passes, e.g. 0.5")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def round_seed(round_: int, digest: bytes) -> int:
    """A seed of the round from ``digest``, bytes every member holds alike and no member
    knew while it trained (the round's reports)."""
    text = round_.to_bytes(8, "little", signed=True) + digest
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def windows(parts: Sequence[Sequence[Range]], samples: int, seed: int) -> list[list[Range]]:
    """Each member's sample: ``samples`` positions of its largest part (all of it where
    it has fewer), in up to ``RUNS`` runs, one in each equal section of the part, at
    offsets drawn from ``seed`` (spread over the round: a local step's samples weigh
    less after the steps that followed it). ``[]``: the member had no part."""
    out: list[list[Range]] = []
    for member, held in enumerate(parts):
        held = [p for p in held if p[1] > p[0]]
        if not held:
            out.append([])
            continue
        start, stop = max(held, key=lambda p: p[1] - p[0])  # (one part: whole runs)
        if stop - start <= samples:
            out.append([(start, stop)])
            continue
        runs = min(RUNS, samples)
        length, section = samples // runs, (stop - start) // runs
        picked = []
        for k in range(runs):
            pick = int.from_bytes(hashlib.blake2b(f"{seed}:{member}:{k}".encode(),
                                                  digest_size=8).digest(), "little")
            first = start + k * section + pick % (section - length + 1)
            picked.append((first, first + length))
        out.append(picked)
    return out


def median_gains(table: Sequence[Sequence[Sequence[float]]], checkers: Sequence[int],
                 targets: Sequence[int]) -> list[list[float]]:
    """Gains by the median over checkers: ``table[c][t][k]`` is checker ``c``'s gain of
    target ``targets[t]``'s pseudo-gradient on member ``k``'s sample (``c`` and ``k``
    index ranks). A target's own checks are left out of its median."""
    out: list[list[float]] = []
    for t, target in enumerate(targets):
        rows = [table[c][t] for c in checkers if c != target] or [table[target][t]]
        out.append([median([r[k] for r in rows]) for k in range(len(rows[0]))])
    return out


def judge_work(gains: Sequence[Sequence[float]], targets: Sequence[int],
               shares: Sequence[float], tolerance: float) -> list[Finding]:
    """The findings against ``targets`` (ranks) from their median ``gains`` (``[t][k]``:
    target ``t``'s pseudo-gradient on rank ``k``'s sample); ``shares``: each rank's
    part of the round."""
    found: list[Finding] = []
    scale = _scale(gains, targets, shares)
    for t, target in enumerate(targets):
        own, others = _own_and_others(gains[t], target)
        if not math.isfinite(own) or own <= 0:
            found.append(Finding(target, NO_WORK, f"its pseudo-gradient changes the loss on "
                                 f"its own samples by {-own:+.3g} (it must lower it)"))
        elif own < others - tolerance * scale:
            found.append(Finding(target, NO_WORK, f"its pseudo-gradient lowers the loss by "
                                 f"{own:.3g} on its own samples and by {others:.3g} on the "
                                 f"others' (tolerance {tolerance:g} x {scale:.3g})"))
    return found


def settle_copies(found: Sequence[Finding], gains: Sequence[Sequence[float]] | None,
                  targets: Sequence[int], shares: Sequence[float], tolerance: float
                  ) -> tuple[list[Finding], list[tuple[int, int]]]:
    """``found`` with each copied pair settled by the work check: of a pair both checked,
    the member on whose samples the shared pseudo-gradient lowers the loss less (by
    over ``tolerance`` of the scale) copied, and only it is struck; where the gains
    cannot tell, both are, as without the check. Pairs not both checked (``gains``
    None: none was) are taken out and returned, to be checked next round."""
    pairs = {tuple(sorted((f.rank, f.party))) for f in found if f.kind == COPIED}
    keep = [f for f in found if f.kind != COPIED]
    unchecked: list[tuple[int, int]] = []
    scale = _scale(gains, targets, shares) if gains is not None else 0.0
    for a, b in sorted(pairs):
        pair = [f for f in found if f.kind == COPIED and {f.rank, f.party} == {a, b}]
        if gains is None or a not in targets or b not in targets:
            unchecked.append((a, b))
            continue
        ga, gb = gains[targets.index(a)], gains[targets.index(b)]
        # (b's data over a's, under a's copy and under b's: the two are nearly the same)
        lead = (ga[b] - ga[a]) + (gb[b] - gb[a])
        if abs(lead) <= 2 * tolerance * scale:
            keep += [f._replace(detail=f"{f.detail}; the work check could not tell which "
                                f"(gains {lead:+.3g} apart)") for f in pair]
            continue
        copier = a if lead > 0 else b
        keep += [f._replace(detail=f"{f.detail}; it lowers the loss {abs(lead) / 2:.3g} less "
                            "on its own samples than on the other's: it copied")
                 for f in pair if f.rank == copier]
    return keep, unchecked


def _own_and_others(row: Sequence[float], target: int) -> tuple[float, float]:
    others = [v for k, v in enumerate(row) if k != target and math.isfinite(v)]
    return row[target], (sum(others) / len(others) if others else -math.inf)


def _scale(gains: Sequence[Sequence[float]], targets: Sequence[int],
           shares: Sequence[float]) -> float:
    """The median target's own gain for its part (a gain grows with the local steps
    between their square root and linearly: the least growth spares an honest member)."""
    middle = median([shares[t] for t in targets]) or 1.0
    relative = [max(s / middle, 1e-12) for s in shares]
    less = [min(r, math.sqrt(r)) for r in relative]
    own = [g[t] / less[t] for g, t in zip(gains, targets, strict=True) if math.isfinite(g[t])]
    scale = median(own)
    if scale <= 0:
        scale = max((abs(v) for g in gains for v in g if math.isfinite(v)), default=0.0)
    return scale
