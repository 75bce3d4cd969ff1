"""Whether a member's pseudo-gradient is work on the data the round assigned it (pure).

A member trained its round on its own part of the round's block. A member's *gain* on
a sample is the loss at the round's start parameters minus the loss at ``start -
delta``. Every target's gain is measured on every member's sample: a table ``G[t][k]``.

An honest member's pseudo-gradient fits its own data best: ``G[t][t]`` stands out of
its row (the target's gains on the others' samples) and of its column (the other
targets' gains on its sample). Its *score* is that double-centered gain,
``G[t][t] - row mean - column mean + mean of the table off its diagonal``. Centering
the row removes how good the target's pseudo-gradient is anywhere. Centering the
column removes how easy its sample is for any pseudo-gradient. Means off the diagonal
leave ``1 / (n - 1)`` of both in the score: the row's stays (an update that gains less
everywhere counts against its member), the column's is taken out as far as it stands
out of its noise (``round_noise.sample_leak``: a hard sample is no fault of its
member's). What is left is the work on its own data. Late in training a member's
replica at the round's end is worse than the start's average on every sample, its own
included, so a gain alone says little; its score stays above 0.

``RoundCheck`` is the setting; ``windows`` picks each member's sample; ``work_scores``,
``judge_work`` and ``settle_copies`` turn the gains into findings. The I/O (the
targets' pseudo-gradients gathered, the losses evaluated, the gains exchanged, each
member's recent scores kept) is ``round_check.py``.

Every checker measures every target's gain on every member's sample. The gains are
exchanged, and each one is the median over the checkers other than the target, so
every honest member holds the same table and reaches the same verdict, and one lying
checker can neither accuse nor acquit anyone.

Each target's gains are first divided by how a gain grows with its part of the round
(``less``: the median part's is 1), so every row is read at the median member's part.
A smaller part's smaller update lowers the loss less on every sample, its own
included; centered as it was, that difference counted against its own sample's score
(``potluck bench cohort`` quarantined its slowest honest member so).

The score of a target is the most it has with any one other member left out of the
table: an attacker's row and column enter every other member's centering, and leaving
it out undoes what it could add to them (not what it adds to the median that scales
every score: gains tens of times an honest member's can inflate it, ``docs/trust.md``
says so). So a round is scored with ``LEAST`` (4)
targets or more; a cohort of 3 trusted members gets no work verdict. The score is
the target's shortfall under the median target's: ``1 - (1 - best / median) /
noisier``, ``noisier`` being 1 at the median part and more below it.

A target is flagged "no work on its data" when the mean of its scores over its last
``WINDOW`` checked rounds is under ``1 - tolerance`` and its shortfall stands out of
its own noise (``round_noise.shortfall_z``: a z-score of ``JUDGE_Z``, or two of its
rounds at ``ROUND_Z`` each, so one good round cannot cancel two attacked ones); or when its
pseudo-gradient makes the loss on a sample not finite. Its noise is what an honest
member's shortfall would be: the fit's noise of one gain without its row, and the
spread of the other members' own-data work, which differs between honest members by
more than that fit says (their parts, their batches). Where even a member that did no
work would not stand out of that noise (``round_noise.power``: small parts, early in
training, when every update lowers the loss on every sample alike), the check
abstains: not enough data to judge the member's work. The mean of a few rounds, not
one round: one round's score is noisy, a member that does not work scores about 0 in
every round. A free rider's zero, a sign flip, an inner-product attack, the honest
mean minus a spread (ALIE), a copy, a replay and training on other labels all score
about 0 or below.

A pair that ``round_rules`` flags as copies sent (nearly) the same pseudo-gradient.
``settle_copies`` strikes only the one that did not do the work: first by the round's
data (``round_copy``: the shared pseudo-gradient fits the other's part, not its own),
else by the windows (its recent scores are under the limit while the other's are not).
Until one of them tells, the pair is noted, not struck.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from potluck.errors import ConfigError
from potluck.trust.round_copy import combined, copier
from potluck.trust.round_noise import (
    JUDGE_Z,
    SETTLE_Z,
    SHORT_ROUNDS,
    Score,
    gain_noise,
    honest_noise,
    noisier,
    power,
    sample_leak,
    score_noise,
    short_rounds,
    shortfall_z,
)
from potluck.trust.round_noise import WINDOW as WINDOW
from potluck.trust.spot import Loss
from potluck.trust.verdict import COPIED, NO_WORK, Finding, median

Range = tuple[int, int]
RUNS = 8  # runs of positions a member's sample is read in
# Targets a round needs for a score: with 3, each member's centering rests on 2 others
# (one may be the attacker, and none can be left out), and honest windows spread
# 0.26 of the median, not 0.20 (the bench: one honest window of 474 at 0.297)
LEAST = 4
# Senders a round needs for the check to say anything at all: of 2, no sample's loss
# has a majority to judge a non-finite one by, and no copied pair a checker outside it
SAYS = 3


@dataclass(frozen=True)
class RoundCheck:
    """``Trust(round_check=RoundCheck(loss))``: check under rounds that each member's
    pseudo-gradient is work on its own data.

    ``loss(model, batch)``: the scalar the loop calls ``backward()`` on, as for
    ``SpotCheck``; it must be deterministic given the parameters and the batch.
    ``samples``: positions of each member's part of the round read for its sample (in
    runs spread over the part, at offsets drawn after the round). ``every``: every member is
    checked every K rounds (and a pair flagged as copies the round after).
    ``tolerance``: how far under the median member's score a member's mean score over
    its last ``WINDOW`` checked rounds may fall (0.7: it must reach 0.3 of it).
    ``copy_samples``: positions of each part of a pair flagged as copies read to tell
    which of the two did the work (``round_copy``; only on rounds with such a pair).
    """

    loss: Loss
    # 128, not 64: the gains' noise is mostly the sample's, and at 64 ALIE's shortfall
    # was about 1.7 of its noise a round (out at round 4 in 2 of 3 seeds of the bench; at
    # 128, round 3 in 13 of 13 and no honest member flagged in 36 clean runs)
    samples: int = 128
    every: int = 1
    tolerance: float = 0.7
    copy_samples: int = 512

    def __post_init__(self) -> None:
        if not callable(self.loss):
            raise ConfigError(f"RoundCheck(loss={self.loss!r}) must be a callable "
                              "loss(model, batch) -> scalar tensor")
        if not _count(self.samples) or self.samples < 1:
            raise ConfigError(f"RoundCheck(samples={self.samples!r}) must be an int >= 1 "
                              "(positions of each member's part read for its sample), e.g. 128")
        if not _count(self.every) or self.every < 1:
            raise ConfigError(f"RoundCheck(every={self.every!r}) must be an int >= 1 (every "
                              "member is checked every K rounds), e.g. 1")
        if not _count(self.copy_samples) or self.copy_samples < 32:
            raise ConfigError(f"RoundCheck(copy_samples={self.copy_samples!r}) must be an int "
                              ">= 32 (positions of each part of a copied pair read to tell "
                              "which member did the work), e.g. 512")
        if (isinstance(self.tolerance, bool) or not isinstance(self.tolerance, (int, float))
                or not 0 <= self.tolerance < 10):
            raise ConfigError(f"RoundCheck(tolerance={self.tolerance!r}) must be a number in "
                              "[0, 10): how far under the median member's score a member's "
                              "mean score may fall, e.g. 0.7 (at least 0.3 of it)")


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
        rows = [table[c][t] for c in outside(checkers, (target,))]
        out.append([median([r[k] for r in rows]) for k in range(len(rows[0]))])
    return out


def outside(checkers: Sequence[int], judged: Sequence[int]) -> list[int]:
    """The checkers whose measures of ``judged`` (a target, or a pair) count: those not
    in it; all of them where none is outside."""
    return [c for c in checkers if c not in judged] or list(checkers)


def work_scores(gains: Sequence[Sequence[float]], targets: Sequence[int],
                shares: Sequence[float]) -> list[float]:
    """Each target's score this round, a ``Score`` carrying the round's signal
    (``gains[t][k]``: target ``targets[t]``'s gain on rank ``k``'s sample; ``shares``:
    each rank's part of the round). ``-inf``: its pseudo-gradient made a loss not
    finite; NaN: no score this round (fewer than ``LEAST`` targets with finite gains,
    or no positive median)."""
    n = len(targets)
    table = [[gains[t][r] for r in targets] for t in range(n)]
    # a sample whose loss is not finite for most targets says nothing of any of them
    known = [k for k in range(n) if 2 * sum(math.isfinite(table[t][k]) for t in range(n)) > n]
    bad = {t for t in range(n) if not all(math.isfinite(table[t][k]) for k in known)}
    keep = [k for k in known if k not in bad]
    out = [-math.inf if t in bad else math.nan for t in range(n)]
    if len(keep) < LEAST:
        return out
    middle = median([shares[targets[t]] for t in keep]) or 1.0
    # (a gain grows with the local steps between their square root and linearly: the
    # least growth spares an honest member that ran fewer)
    less = {t: max(min(r, math.sqrt(r)), 1e-12)
            for t in keep for r in [max(shares[targets[t]] / middle, 1e-12)]}
    # each target's gains at the median member's part, before any centering: a smaller
    # part's smaller update would otherwise count against its own sample's score
    table = [[g / less[t] for g in row] if t in less else row for t, row in enumerate(table)]
    off: dict[tuple[int, ...], float] = {}
    # one gain's noise, with each target's row out of the fit (``error``, below: an honest
    # member's gains vary by it, an attacker's may vary tens of times more) and over the
    # whole table (``noise``). Each sizes how much of a sample's effect a score takes out
    # (``sample_leak``): a target's yardstick is read with its row out, so it moves
    # neither; its own score and the median's with the whole table's (an attacker whose
    # gains vary wildly inflates it: those scores then fall back to the means alone)
    noise = gain_noise(table, keep)
    centered = [_centered(table, keep, t, noise, off) for t in keep]
    full = median(centered)
    if not full > 0:
        return out
    for t in keep:
        # its yardstick were it honest: the noise without its row, and the spread of the
        # others' work over the table without it (the target moves neither)
        error = gain_noise(table, keep, without=t)
        rest = [k for k in keep if k != t]
        others = [_centered(table, rest, u, error, off) for u in rest]
        spread = honest_noise(others, [score_noise(len(rest)) * error * noisier(less, keep, u)
                                       for u in rest],
                              score_noise(len(keep)) * error * noisier(less, keep, t))
        best = max(_centered(table, [k for k in keep if k != u], t, noise, off)
                   for u in rest)
        value = 1 - (1 - best / full) / noisier(less, keep, t)
        # its shortfall under the others' work, in units of its noise were it honest: an
        # attacker moves neither (the value, under the median's, sizes the effect)
        typical = median(others)
        out[t] = (Score(value, 1 - best / typical, spread / typical) if typical > 0
                  else Score(value, 0.0, math.inf))
    return out


def _centered(table: Sequence[Sequence[float]], keep: Sequence[int], t: int,
              noise: float, off: dict[tuple[int, ...], float] | None = None) -> float:
    """``t``'s own gain, double-centered over the square table of ``keep``, less what of
    its sample's effect the centering leaves in it (``round_noise.sample_leak``; ``noise``:
    one gain's). ``off``: the means of the cells off the diagonal already taken, by
    ``keep`` (one sum per table, not one per target: O(n ** 4) a round otherwise)."""
    others = [k for k in keep if k != t]
    row = sum(table[t][k] for k in others) / len(others)
    column = sum(table[u][t] for u in others) / len(others)
    key = tuple(keep)
    mean = None if off is None else off.get(key)
    if mean is None:
        cells = [table[u][k] for u in keep for k in keep if u != k]
        mean = sum(cells) / len(cells)
        if off is not None:
            off[key] = mean
    leak = sample_leak(column - mean, row - mean, len(keep), noise)
    return table[t][t] - row - column + mean - leak


def judge_work(recent: Mapping[int, Sequence[float]], tolerance: float) -> list[Finding]:
    """The findings against the targets (ranks) from ``recent``: each one's scores of
    its last checked rounds, the newest last."""
    found: list[Finding] = []
    for target, scores in sorted(recent.items()):
        if scores and scores[-1] == -math.inf:
            found.append(Finding(target, NO_WORK, "its pseudo-gradient makes the loss on a "
                                                  "member's sample not finite"))
            continue
        if under(scores, 1 - tolerance):
            found.append(Finding(target, NO_WORK, f"its pseudo-gradient lowers the loss on its "
                                 f"own samples, over the others', {window_mean(scores):.2f}x "
                                 f"as much as the median member's (mean of its last {WINDOW} "
                                 f"checked rounds; limit {1 - tolerance:.2g})"))
    return found


def window_mean(scores: Sequence[float]) -> float:
    """The mean of the last ``WINDOW`` scores; NaN while fewer are known."""
    last = list(scores)[-WINDOW:]
    return sum(last) / WINDOW if len(last) == WINDOW else math.nan


def under(scores: Sequence[float], limit: float, z: float = JUDGE_Z) -> bool | None:
    """Whether the mean of the last ``WINDOW`` scores is under ``limit`` and the
    member's shortfall stands out of its own noise (``round_noise.shortfall_z`` at least
    ``z``, or ``SHORT_ROUNDS`` rounds each at ``ROUND_Z``: ``short_rounds``). None
    while it cannot tell: fewer scores, or, short of a finding, too little data to judge
    this member's work (a member that did no work would not have stood out of this
    one's noise: ``round_noise.power``)."""
    if len(scores) < WINDOW:
        return None
    if window_mean(scores) < limit and (shortfall_z(scores) >= z
                                        or short_rounds(scores) >= SHORT_ROUNDS):
        return True
    return None if power(scores) < z else False


def settle_copies(found: Sequence[Finding], recent: Mapping[int, Sequence[float]],
                  tolerance: float,
                  paired: Mapping[tuple[int, int], Sequence[float]] | None = None,
                  ) -> tuple[list[Finding], list[tuple[int, int]]]:
    """``found`` with each copied pair settled: of a pair, only the member that did not
    do the work it sent is struck. First by the round's data (``paired``: each pair's
    z-scores of its flagged rounds, ``round_copy``): the member whose part the shared
    pseudo-gradient fits worse copied. Else by the work check's windows: the member
    whose recent scores are under ``1 - tolerance`` while the other's are not, at
    ``SETTLE_Z`` (not ``JUDGE_Z``: the copy is certain, the scores only tell which of
    the two did not do the work). A pair neither can settle yet is taken out and
    returned, to be noted and checked again next round."""
    pairs = {tuple(sorted((f.rank, f.party))) for f in found if f.kind == COPIED}
    struck: list[Finding] = []  # (first: a copier's quarantine names the copy)
    unchecked: list[tuple[int, int]] = []
    limit = 1 - tolerance
    for a, b in sorted(pairs):
        scores = (paired or {}).get((a, b), ())
        by_data = copier((a, b), scores)
        if by_data is not None:
            why = (f"the shared pseudo-gradient fits the other's samples, not its own "
                   f"(z = {abs(combined(scores)):.1f} over {len(scores)} round(s)): it copied")
            struck += _struck(found, by_data, (a, b), why)
            continue
        low = {r for r in (a, b) if under(recent.get(r, ()), limit, SETTLE_Z) is True}
        high = {r for r in (a, b) if under(recent.get(r, ()), limit, SETTLE_Z) is False}
        if len(low) != 1 or len(high) != 1:
            unchecked.append((a, b))
            continue
        (low_one,) = low
        struck += _struck(found, low_one, (a, b), "its work on its own samples is under "
                                                  "the limit, the other's is not: it copied")
    return struck + [f for f in found if f.kind != COPIED], unchecked


def _struck(found: Sequence[Finding], rank: int, pair: tuple[int, int],
            why: str) -> list[Finding]:
    """``rank``'s copied findings of ``pair``, with why it is the one that copied."""
    return [f._replace(detail=f"{f.detail}; {why}") for f in found
            if f.kind == COPIED and f.rank == rank and {f.rank, f.party} == set(pair)]
