"""How far the work check's scores stand out of their noise (pure).

A gain ``G[t][k]`` is taken as a row effect (how good target ``t``'s pseudo-gradient
is on any sample) plus a column effect (how easy member ``k``'s sample is for any
pseudo-gradient) plus noise. The cells off the diagonal fit the two effects by least
squares; the diagonal, the own gains, is what the check judges, so it stays out. The
fit's residuals give the noise of one gain (``gain_noise``: ``n * n - 3 * n + 1``
degrees of freedom, 5 with 4 members).

Honest members' own-data work also differs from member to member by more than that
noise: on ``potluck bench cohort --quick`` (parts of 4 to 36 samples) their centered
own gains spread 2 to 4 times the fit's standard error in early rounds. So a member's
``Score`` carries its shortfall under the other members' median work and that
shortfall's noise were it honest (``honest_noise``: the fit's noise without its row,
plus the other members' spread beyond their own noise; the member itself moves
neither). ``shortfall_z``: the window's shortfalls in units of their noise, as one
z-score, each round's within ``ROUND_Z`` (one round whose noise was read too small
must not carry a window); a member is flagged only where it reaches ``JUDGE_Z``, or
where ``SHORT_ROUNDS`` of its rounds each reach ``ROUND_Z`` (``short_rounds``).
``power``: the z-score a member that did no work would reach; under ``JUDGE_Z`` the
check abstains.

``noisier``: how many times noisier a member's score is than a median part's member's,
its gains having been scaled up to the median part.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

WINDOW = 3  # checked rounds a member's scores are averaged over
# the z-score a member's shortfall must reach over a window to be flagged, and the one a
# member that did no work would reach for its window to be judged at all. 3, not 2: a run
# judges hundreds of windows, and the honest spread is read from 3 other members (heavy
# tails); at 2 an honest member of the quick cohort bench was flagged at round 4 (quiet
# machine, seed 0). With ``RoundCheck.samples`` at 128 every attack of the byzantine bench is
# out by round 3 at this bar.
JUDGE_Z = 3.0
# the bar for telling which of a copied pair did not do the work (the copy is certain)
SETTLE_Z = 2.0
# the most one round's shortfall counts, in units of its noise: a round's noise is read
# from about 3 degrees of freedom and now and then far too small, so one round must not
# carry a window. At 3 a window reaches JUDGE_Z only with a shortfall in 2 rounds or more.
# (Early in nanoGPT's training one honest round read 4.9 and 6.7 of its noise, and that
# one round carried its member's window to a quarantine at round 3, read with scores
# centered on the means alone, without ``sample_leak``.)
ROUND_Z = 3.0
# rounds of a window whose shortfall reaches ROUND_Z that flag it on their own (its mean
# under the limit too): one honest round above the median must not cancel two rounds of
# an attack in the sum (``potluck bench cohort``: an attacker's rounds at 6 and 518 of
# their noise, then an honest round at -1.7, summed to 2.5 and it was never judged again:
# the cohort had 3 members after). The sum already flagged two capped rounds unless the
# third read under -0.8 of its noise, so this adds only those windows: a small part of an
# already rare event for an honest member (simulated honest member-windows: 9 of 1,200
# had one round at ROUND_Z, none two).
SHORT_ROUNDS = 2


class Score(float):
    """A member's score of one round (the float), with its ``shortfall`` under the median
    member's own-data work (in units of it: 0 for the median, 1 for no work) and
    ``noise``, that shortfall's standard deviation for an honest member."""

    shortfall: float
    noise: float

    def __new__(cls, value: float, shortfall: float, noise: float) -> Score:
        score = super().__new__(cls, value)
        score.shortfall, score.noise = shortfall, noise
        return score


def _rounds(scores: Sequence[float]) -> list[Score] | None:
    """The last ``WINDOW`` scores (None: a plain float among them: it carries no noise)."""
    last = list(scores)[-WINDOW:]
    return [s for s in last if isinstance(s, Score)] if all(
        isinstance(s, Score) for s in last) else None


def power(scores: Sequence[float]) -> float:
    """The z-score a member that did no work would reach over the last ``WINDOW``
    rounds: a shortfall of 1 in each, over its noise, within ``ROUND_Z`` (inf: a plain
    float among them)."""
    last = _rounds(scores)
    if last is None:
        return math.inf
    return sum(_capped(1 / max(s.noise, 1e-12)) for s in last) / math.sqrt(WINDOW)


def shortfall_z(scores: Sequence[float]) -> float:
    """The z-score of the member's shortfall over the last ``WINDOW`` rounds: each
    round's shortfall in units of its own noise, within ``ROUND_Z`` either way, summed
    over ``sqrt(WINDOW)`` (a round an attack began in counts up to ``ROUND_Z``, however
    quiet the honest rounds before it). A plain float among them: the shortfall's sign,
    as inf."""
    last = _rounds(scores)
    if last is None:
        return math.copysign(math.inf, sum(1 - s for s in list(scores)[-WINDOW:]))
    return sum(_capped(_z(s)) for s in last) / math.sqrt(WINDOW)


def short_rounds(scores: Sequence[float]) -> int:
    """Rounds of the last ``WINDOW`` whose shortfall reaches ``ROUND_Z`` times its
    noise (0 where a plain float is among them, which carries no noise, or a round
    whose shortfall is unknown: NaN is no verdict)."""
    last = _rounds(scores)
    if last is None or any(math.isnan(_z(s)) for s in last):
        return 0
    return sum(_z(s) >= ROUND_Z for s in last)


def _z(score: Score) -> float:
    """One round's shortfall in units of its noise."""
    return score.shortfall / max(score.noise, 1e-12)


def _capped(z: float) -> float:
    """One round's z-score, within ``ROUND_Z`` either way (NaN stays NaN: no verdict)."""
    return z if math.isnan(z) else max(-ROUND_Z, min(ROUND_Z, z))


def honest_noise(others: Sequence[float], errors: Sequence[float], own: float) -> float:
    """The standard deviation of a target's double-centered own gain were it honest.
    ``own``: its standard error from the gains' fit. Honest members' own-data work
    differs by more than that (their parts, their batches, what each memorized): the
    spread of ``others``, the other members' centered own gains over the table without
    the target, beyond their standard errors (``errors``), is added. Without the target:
    an attacker's own gains can neither widen nor narrow its yardstick."""
    mean = sum(others) / len(others)
    spread = sum((c - mean) ** 2 for c in others) / max(len(others) - 1, 1)
    theirs = sum(e ** 2 for e in errors) / len(errors)
    return math.sqrt(max(0.0, spread - theirs) + own ** 2)


def gain_noise(table: Sequence[Sequence[float]], keep: Sequence[int],
               without: int | None = None) -> float:
    """The standard deviation of a gain about its row and column effects, from the
    least-squares fit of the cells off the diagonal of ``keep``'s table (0 under 4);
    ``without``: a target whose row stays out of the fit (the noise were it honest).

    The fit is solved in closed form, in O(n * n): a row's and a column's normal
    equations pair up member by member into 2 x 2 systems, tied only by the sum of the
    column effects (the row effects' sum is fixed at 0: the fit's one free constant)."""
    n = len(keep)
    if n < 4:
        return 0.0
    if without not in keep:
        without = None  # (no row of the table to leave out)
    rows = [u for u in keep if u != without]
    across = {u: sum(table[u][k] for k in keep if k != u) for u in rows}
    down = {k: sum(table[u][k] for u in rows if u != k) for k in keep}
    total = sum(across.values())
    col: dict[int, float] = {}
    if without is None:
        # row u: (n-1) r_u + C - c_u = across_u; column u: (n-1) c_u - r_u = down_u
        det, pull = n * (n - 2), total / (n - 1)  # (pull: C, the column effects' sum)
        lean = n - 1  # (a column's own coefficient: it misses no row)
    else:
        # column ``without`` has every row: (n-1) c_w = down_w; the others miss one row
        col[without] = down[without] / (n - 1)
        det, lean = (n - 1) * (n - 2) - 1, n - 2  # (lean: a column without one row)
        pull = (det * col[without] + n * total - (n - 1) * down[without]) / (det + n - 1)
    row = {u: (lean * (across[u] - pull) + down[u]) / det for u in rows}
    col.update({u: ((across[u] - pull) + (n - 1) * down[u]) / det for u in rows})
    squares = sum((table[u][k] - row[u] - col[k]) ** 2 for u in rows for k in keep if k != u)
    free = len(rows) * (n - 1) - len(rows) - n + 1  # (the degrees of freedom left)
    return math.sqrt(squares / free)


def sample_leak(column: float, row: float, n: int, noise: float) -> float:
    """What of its sample's effect (how much any pseudo-gradient gains on it) a target's
    own gain keeps when centered on the means of its row and column off the diagonal:
    ``column`` and ``row``, those means less the table's mean off the diagonal; ``n``
    members in the table (3 or more); ``noise``, one gain's (``gain_noise``).

    Those means leave ``1 / (n - 1)`` of the row's and the column's effects in the score
    (at 4 members a third, at 3 a half). The row's stays: an update that gains less on
    every sample counts against its member (a free rider's, an inner-product attack's).
    The column's goes: a sample that every update gains less on is no fault of its
    member's (left in, it struck an honest member at round 3 early in nanoGPT's
    training). Its least-squares estimate is taken out in the measure it stands out of
    its own noise: all of it from a sample far harder or easier than the others',
    nothing from one within one standard deviation (it would only add noise)."""
    if n < 3:
        return 0.0
    effect = (column + row / (n - 1)) * (n - 1) ** 2 / (n * (n - 2))
    spread = noise ** 2 * (n - 1) ** 2 / (n ** 2 * (n - 2))  # (the estimate's variance)
    if not effect * effect > spread:
        return 0.0
    return (1 - spread / (effect * effect)) * effect / (n - 1)


def score_noise(n: int) -> float:
    """A double-centered score's standard deviation over one gain's, ``n`` members in
    the table: the score weighs its own gain 1, its row's and column's ``-1 / n`` each,
    the other cells off the diagonal ``1 / (n (n - 1))``. (A sample's effect taken out
    whole, ``sample_leak``, makes it 1.27 at 4 members, not 1.19. That is left out:
    counted, it changed no verdict on nanoGPT's tables nor in the unit sweeps.)"""
    return math.sqrt(1 + 2 * (n - 1) / n ** 2 + (n - 2) / (n ** 2 * (n - 1)))


def noisier(less: Mapping[int, float], keep: Sequence[int], t: int) -> float:
    """How many times noisier ``t``'s score is than a member of the median part's in its
    place, at least 1 (``less[u]``: what member ``u``'s gains were divided by, so the
    noise of its gains was too; weights as in ``score_noise``)."""
    n = len(keep)
    own = 1 + (n - 1) / n ** 2  # its own gain and its row
    each = 1 / n ** 2 + (n - 2) / (n * (n - 1)) ** 2  # another member's cells
    others = sum(each / less[u] ** 2 for u in keep if u != t)
    return max(1.0, math.sqrt((own / less[t] ** 2 + others) / (own + others)))
