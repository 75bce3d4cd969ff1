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
samples. The z-score is Welch's: the difference of the two parts' mean chunk values
over its standard error (``pair_z``; positive: ``d`` fits the first member's part).

One round's z-scores are kept per pair and combined over the pair's last ``WINDOW``
flagged rounds (``combined``: their sum over the square root of their count). The
pair is settled when the combined z-score reaches ``COPY_Z`` (3): the member whose
part ``d`` fits worse copied. The false-positive bound designed for: were ``d`` to fit
neither part better (no own-data signal at all), the honest member of a pair is
struck with probability ``Phi(-3)``, about 1.3e-3, per settled pair (with 64 chunks a
side the t-distribution's tail is within 10% of the normal's). The honest member's
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
    """Welch's z-score of ``mean(first) - mean(second)`` (each: a side's chunk values;
    NaN: fewer than ``LEAST_CHUNKS`` on a side, a value not finite, or no spread)."""
    if min(len(first), len(second)) < LEAST_CHUNKS:
        return math.nan
    if not all(math.isfinite(v) for v in (*first, *second)):
        return math.nan
    (m1, v1), (m2, v2) = _moments(first), _moments(second)
    error = math.sqrt(v1 / len(first) + v2 / len(second))
    return (m1 - m2) / error if error > 0 else math.nan


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
