"""When far steps quarantine a sender: a designed false-positive rate (pure).

An honest copy is now and then far from the center. A small batch may hold a sample
whose gradient is far from the others', and that one step's copy is then several times
the median sender's distance away. Such steps are rare, and one step's luck says nothing
about the next: each step draws new samples. An attacker sending garbage is far on most
steps it attacks.

``rate`` is how often an honest sender is far in a step, measured over the last
``Rules.far_window`` steps on the reports every rank holds, so every honest rank
reaches the same verdict: the upper median, over the senders other than the one judged
(its own far steps must not excuse it), of each sender's rate, with a prior of
``PRIOR_FAR`` far steps in ``PRIOR_STEPS``. Fewer than half of the cohort can move an
upper median neither below nor above every honest sender's rate: colluders that are
never far cannot lower it, and attackers far every step cannot raise it.

A sender is quarantined for being far by any of the rules in use, each at an equal
share ``alpha`` of ``Rules.false_positive``, so an honest sender's chance per step is at
most ``Rules.false_positive`` while its far steps are independent at the measured rate:

- ``k`` far steps in a row, ``k`` the least count (at least ``Rules.strikes[FAR]``)
  with ``rate ** k <= alpha`` (``needed``): an attacker far every step, quickly;
- or more far steps in the window than an honest sender makes with chance ``alpha``
  (the binomial tail, ``too_often``), at the rate's 95% upper bound
  (``rate_at_most``): an attacker far on most steps but not all;
- and, where the caller marks *gross* steps (far well beyond ``far_ratio``: rounds do,
  ``round_rules.GROSS``; every step does not, as a step's copy of a few samples can
  hold one far sample), the last ``L`` steps far, ``L`` = ``Rules.strikes[FAR]`` (at
  least 2), one or more of them gross, where an honest sender's chance of that,
  ``(rate + gross_rate) ** L - rate ** L`` (``gross_chance``), is at most ``alpha``.
  An honest sender's gross rate is measured as the far rate is, with the far prior
  squared (1 in 10^6): being that far once is taken to be at most as likely as being
  far twice. So two gross rounds, or a far and a gross one, quarantine a new cohort's
  member where far ones need three.

Every step the first two rules are in use (``alpha`` a half), under rounds all three (a
third). The first and third rules take the rates as measured: where an honest sender's
rate is higher than the window saw by chance, or than the prior before the window
fills, its chance is higher than the design. The second takes the upper bound, so the
few steps a new window holds cannot make an honest sender's count look unlikely.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Sequence
from typing import Any

PRIOR_FAR = 0.02  # a new cohort starts at a rate of 1 in 1,000, and data soon rule
PRIOR_STEPS = 20
PRIOR_GROSS = PRIOR_STEPS * (PRIOR_FAR / PRIOR_STEPS) ** 2  # (a rate of 1e-6)
MOST_IN_A_ROW = 16  # beyond it the limit (far_ratio) is wrong for the workload, not k

Step = tuple[int, tuple[str, ...], frozenset[str], frozenset[str]]  # step, judged, far, gross


class FarWatch:
    """Which senders were far in each of the last ``window`` steps (at least
    ``MOST_IN_A_ROW``: a run must fit in it)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._steps: deque[Step] = deque(maxlen=window)
        self._judged: dict[str, int] = {}  # steps in the window each sender was judged in
        self._far: dict[str, int] = {}  # and was far in
        self._gross: dict[str, int] = {}  # and was gross in

    def record(self, step: int, judged: Sequence[str], far: Collection[str],
               gross: Collection[str] = ()) -> None:
        """Step ``step``: ``judged`` senders were scored, ``far`` of them were far,
        ``gross`` of those grossly so. A step recorded again (a redone step) replaces
        the first record of it."""
        if self._steps and self._steps[-1][0] == step:
            self._count(self._steps.pop(), -1)
        elif len(self._steps) == self.window:
            self._count(self._steps[0], -1)
        flagged = frozenset(far) & frozenset(judged)
        entry = (step, tuple(judged), flagged, frozenset(gross) & flagged)
        self._steps.append(entry)
        self._count(entry, 1)

    def _count(self, entry: Step, sign: int) -> None:
        for m in entry[1]:
            self._judged[m] = self._judged.get(m, 0) + sign
            self._far[m] = self._far.get(m, 0) + sign * (m in entry[2])
            self._gross[m] = self._gross.get(m, 0) + sign * (m in entry[3])
            if not self._judged[m]:
                del self._judged[m], self._far[m], self._gross[m]

    def counts(self, member: str) -> tuple[int, int]:
        """``member``'s far steps and judged steps in the window."""
        return self._far.get(member, 0), self._judged.get(member, 0)

    def rate(self, member: str | None = None) -> float:
        """How often an honest sender is far in a step: the upper median over the
        senders other than ``member`` of each one's rate, with the prior."""
        rates = sorted((self._far[m] + PRIOR_FAR) / (self._judged[m] + PRIOR_STEPS)
                       for m in self._judged if m != member)
        return rates[len(rates) // 2] if rates else PRIOR_FAR / PRIOR_STEPS

    def gross_rate(self, member: str | None = None) -> float:
        """As ``rate``, of gross steps, with the prior ``PRIOR_GROSS``."""
        rates = sorted((self._gross[m] + PRIOR_GROSS) / (self._judged[m] + PRIOR_STEPS)
                       for m in self._judged if m != member)
        return rates[len(rates) // 2] if rates else PRIOR_GROSS / PRIOR_STEPS

    def rate_at_most(self, member: str | None = None) -> float:
        """As ``rate``, of each sender's one-sided 95% upper bound instead: what an
        honest rate may be, given that so few steps were seen."""
        bounds = sorted(upper_bound(self._far[m], self._judged[m])
                        for m in self._judged if m != member)
        return bounds[len(bounds) // 2] if bounds else 1.0

    def in_a_row(self, member: str) -> int:
        """Far steps in a row ending at the last recorded step in which ``member`` was
        judged (a step it was not judged in neither breaks nor extends the run)."""
        return len(self.run(member))

    def run(self, member: str) -> list[bool]:
        """``member``'s far steps in a row (as ``in_a_row``), the last first: whether
        each was gross."""
        out: list[bool] = []
        for _, members, flagged, gross in reversed(self._steps):
            if member not in members:
                continue
            if member not in flagged:
                break
            out.append(member in gross)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"steps": [[s, list(m), sorted(f), sorted(g)] for s, m, f, g in self._steps]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._steps.clear()
        self._judged, self._far, self._gross = {}, {}, {}
        for s, m, f, *g in state.get("steps", [])[-self.window:]:  # (no gross: older)
            self.record(int(s), m, f, g[0] if g else ())


def needed(rate: float, least: int, false_positive: float) -> int:
    """Far steps in a row that quarantine: the least ``k >= least`` with
    ``rate ** k <= false_positive`` (at most ``MOST_IN_A_ROW``)."""
    if rate <= 0:
        return least
    if rate >= 1:
        return MOST_IN_A_ROW
    k = math.ceil(math.log(false_positive) / math.log(rate) - 1e-9)
    return max(least, min(k, MOST_IN_A_ROW))


def gross_chance(rate: float, gross_rate: float, length: int) -> float:
    """An honest sender's chance that its last ``length`` steps are all far and one or
    more of them gross, each step far at ``rate`` at most and gross at ``gross_rate``
    (independent steps): the sum over those patterns of far and gross steps."""
    return (rate + gross_rate) ** length - rate ** length


def too_often(far: int, judged: int, rate: float, alpha: float) -> bool:
    """Whether ``far`` far steps in ``judged`` are more than an honest sender far at
    ``rate`` a step makes with chance ``alpha`` (the binomial tail)."""
    if far < 1 or not 0 < rate < 1:
        return False
    tail = sum(math.comb(judged, x) * rate ** x * (1 - rate) ** (judged - x)
               for x in range(far, judged + 1))
    return tail <= alpha


def upper_bound(far: int, judged: int, confidence: float = 0.95) -> float:
    """The one-sided upper bound on a rate that made ``far`` events in ``judged``
    trials (Clopper and Pearson: the rate at which so few or fewer are that unlikely)."""
    if judged <= 0 or far >= judged:
        return 1.0
    low, high = far / judged, 1.0
    for _ in range(50):  # bisection on the binomial CDF, which falls as the rate grows
        mid = (low + high) / 2
        cdf = sum(math.comb(judged, x) * mid ** x * (1 - mid) ** (judged - x)
                  for x in range(far + 1))
        low, high = (mid, high) if cdf > 1 - confidence else (low, mid)
    return high
