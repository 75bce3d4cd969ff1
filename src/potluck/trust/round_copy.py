"""Which member of a copied pair did the work, from the data of the round (pure).

``round_rules`` flags two members whose pseudo-gradients are (nearly) equal: one of
the two copied. The values cannot say which. The data can: the shared
pseudo-gradient ``d`` was trained on the part of the round the loader assigned to the
member that did the work, so it lowers the loss there more than on the copier's part.

The test is paired, sample by sample. A *reference* update (the mean of the round's
other targets' pseudo-gradients) is evaluated on the same samples, and a chunk's value
is ``loss(start - reference) - loss(start - d)``: how much better ``d`` does than the
reference there. How hard a sample is cancels out. Each pair member's part is read at
up to ``RoundCheck.copy_samples`` positions (512 by default), in chunks of ``CHUNK``
samples. The statistic is Welch's t: the difference of the two parts' mean chunk
values over its standard error, with Welch's degrees of freedom; ``pair_z`` hands it
back as the normal z-score of the same tail probability (``t_as_z``), so a side of few
chunks asks for a larger t (positive: ``d`` fits the first member's part).

A pair's z-scores are kept for its first ``WINDOW`` flagged rounds that could be
measured, and combined (``combined``: their sum over the square root of their count);
the pair is settled when that reaches ``COPY_Z`` (3): the member whose part ``d`` fits
worse copied. After those rounds the data stops looking (the work check's windows
still judge the pair): every look is one more chance for a false strike. The
false-positive bound designed for: were ``d`` to fit neither part better (no own-data
signal at all), each look strikes the honest member with probability about
``Phi(-3)``, 1.3e-3, so at most about 4e-3 over a pair's looks. The honest member's
true signal only lowers it. A pair can only be flagged where an attacker sent a copy:
two honest members never send the same pseudo-gradient (``round_rules.COPY_RATIO``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

CHUNK = 8  # samples a chunk: one loss a chunk, one value of the test
COPY_Z = 3.0  # the combined z-score that settles a pair
LEAST_CHUNKS = 4  # on each side, for a standard error at all

Range = tuple[int, int]


def chunks(runs: Sequence[Range], size: int = CHUNK) -> list[Range]:
    """``runs`` cut into ranges of ``size`` positions (the last of a run may be shorter)."""
    return [(x, min(x + size, stop)) for start, stop in runs for x in range(start, stop, size)]


def pair_z(first: Sequence[float], second: Sequence[float]) -> float:
    """Welch's t of ``mean(first) - mean(second)`` as a normal z-score of the same tail
    (each: a side's chunk values; NaN: fewer than ``LEAST_CHUNKS`` on a side, a value
    not finite, or no spread)."""
    if min(len(first), len(second)) < LEAST_CHUNKS:
        return math.nan
    if not all(math.isfinite(v) for v in (*first, *second)):
        return math.nan
    (m1, v1), (m2, v2) = _moments(first), _moments(second)
    e1, e2 = v1 / len(first), v2 / len(second)
    if not e1 + e2 > 0:
        return math.nan
    freedom = (e1 + e2) ** 2 / (e1 ** 2 / (len(first) - 1) + e2 ** 2 / (len(second) - 1))
    return t_as_z((m1 - m2) / math.sqrt(e1 + e2), freedom)


def t_as_z(t: float, freedom: float) -> float:
    """The normal z-score with about the tail probability of Student's ``t`` at
    ``freedom`` degrees of freedom (Wallace's approximation). From 3 degrees of freedom
    on it is never above the exact one, so it errs toward not striking: at 6, t = 3
    reads as z = 2.17 (exact 2.26); at 30, 2.77 (exact 2.78)."""
    return t * (1 - 1 / (4 * freedom)) / math.sqrt(1 + t * t / (2 * freedom))


def _moments(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def combined(scores: Sequence[float]) -> float:
    """The pair's rounds as one z-score: the sum of the finite ones over the square root
    of their count (NaN: none)."""
    known = [z for z in scores if math.isfinite(z)]
    return sum(known) / math.sqrt(len(known)) if known else math.nan


def copier(pair: tuple[int, int], scores: Sequence[float]) -> int | None:
    """The member of ``pair`` that copied, by the pair's z-scores (positive: the shared
    pseudo-gradient fits ``pair[0]``'s part); None while they cannot tell."""
    z = combined(scores)
    if not abs(z) >= COPY_Z:  # (NaN: cannot tell)
        return None
    return pair[1] if z > 0 else pair[0]
