"""How far the work check's scores stand out of their noise (pure).

A gain ``G[t][k]`` is taken as a row effect (how good target ``t``'s pseudo-gradient
is on any sample) plus a column effect (how easy member ``k``'s sample is for any
pseudo-gradient) plus noise. The cells off the diagonal fit the two effects by least
squares; the diagonal, the own gains, is what the check judges, so it stays out. The
fit's residuals give the noise of one gain (``gain_noise``: ``n * n - 3 * n + 1``
degrees of freedom, 5 with 4 members).

A round's *signal* is the median member's double-centered own gain over that score's
standard error. A member's ``Score`` of a round carries it. ``significant``: a window
of scores is judged only when its rounds' signals, summed over ``sqrt(WINDOW)``, reach
``SIGNAL_Z``, the z-score of the mean signal: the median member's work on its own data
stands out of the noise over the window. Without it, the median's score is noise, and
so is every member's ratio to it: early in training every update lowers the loss on
every sample alike, and the own gains differ from the others' by less than the noise.

``noisier``: how many times noisier a member's score is than a median part's member's,
its gains having been scaled up to the median part.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

WINDOW = 3  # checked rounds a member's scores are averaged over
# the z-score the median member's signal must reach over a window: without any own-data
# signal, 1 window in 44 is judged (on the byzantine bench, the attacked windows' z-scores
# were 2.5 and more)
SIGNAL_Z = 2.0


class Score(float):
    """A member's score of one round (the float), with the round's ``signal``: the
    median member's double-centered own gain over its standard error."""

    signal: float

    def __new__(cls, value: float, signal: float) -> Score:
        score = super().__new__(cls, value)
        score.signal = signal
        return score


def significant(scores: Sequence[float]) -> bool:
    """Whether the last ``WINDOW`` scores' rounds stand out of the noise (a plain float
    carries no signal: taken as significant)."""
    last = list(scores)[-WINDOW:]
    signals = [s.signal if isinstance(s, Score) else math.inf for s in last]
    return len(last) == WINDOW and sum(signals) / math.sqrt(WINDOW) >= SIGNAL_Z


def gain_noise(table: Sequence[Sequence[float]], keep: Sequence[int]) -> float:
    """The standard deviation of a gain about its row and column effects, from the
    least-squares fit of the cells off the diagonal of ``keep``'s table (0 under 4)."""
    n = len(keep)
    if n < 4:
        return 0.0
    cells = {(u, k): table[u][k] for u in keep for k in keep if u != k}
    mean = sum(cells.values()) / len(cells)
    # (the fit in closed form: each row's and column's sum about the mean, then the
    # 2 x 2 system of a row effect and the column effect of the same member)
    rows = {t: sum(cells[t, k] for k in keep if k != t) - (n - 1) * mean for t in keep}
    cols = {t: sum(cells[u, t] for u in keep if u != t) - (n - 1) * mean for t in keep}
    row = {t: ((n - 1) * rows[t] + cols[t]) / (n * (n - 2)) for t in keep}
    col = {t: ((n - 1) * cols[t] + rows[t]) / (n * (n - 2)) for t in keep}
    squares = sum((g - mean - row[u] - col[k]) ** 2 for (u, k), g in cells.items())
    return math.sqrt(squares / (n * n - 3 * n + 1))


def score_noise(n: int) -> float:
    """A double-centered score's standard deviation over one gain's, ``n`` members in
    the table: the score weighs its own gain 1, its row's and column's ``-1 / n`` each,
    the other cells off the diagonal ``1 / (n (n - 1))``."""
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
