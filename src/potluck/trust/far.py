"""How many far steps in a row quarantine a sender: a designed false-positive rate (pure).

An honest copy is now and then far from the center. A small batch may hold a sample
whose gradient is far from the others', and that one step's copy is then several times
the median sender's distance away. Such steps are rare, and one step's luck says nothing
about the next: each step draws new samples. An attacker sending garbage is far on every
step it attacks.

So a sender is quarantined for being far only after ``k`` far steps in a row. ``k`` is
the least count, at least ``Rules.strikes[FAR]``, for which an honest sender's chance of
``k`` in a row, ``rate ** k``, is at most ``Rules.false_positive`` (1e-8 by default, per
sender and step). ``rate`` is how often honest senders were far over the last
``Rules.far_window`` steps, measured on the reports every rank holds, so every honest
rank computes the same ``k``:

- the sender judged is left out of the count (its own far steps must not excuse it),
  and so are the other senders with the most far steps, fewer than half of the cohort
  (possible attackers);
- a prior of ``PRIOR_FAR`` far steps in ``PRIOR_STEPS`` is added, so a new cohort starts
  at a rate of 1 in 1,000 (``k`` = 3) and learns its own.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Sequence
from typing import Any

PRIOR_FAR = 0.1
PRIOR_STEPS = 100
MOST_IN_A_ROW = 16  # beyond it the limit (far_ratio) is wrong for the workload, not k


class FarWatch:
    """Which senders were far in each of the last ``window`` steps."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._steps: deque[tuple[int, tuple[str, ...], frozenset[str]]] = deque(maxlen=window)

    def record(self, step: int, judged: Sequence[str], far: Collection[str]) -> None:
        """Step ``step``: ``judged`` senders were scored, ``far`` of them were far."""
        self._steps.append((step, tuple(judged), frozenset(far) & frozenset(judged)))

    def rate(self, member: str | None = None) -> float:
        """How often an honest sender is far in a step (with the prior), measured on
        the senders other than ``member`` (its own far steps must not excuse it)."""
        judged: dict[str, int] = {}
        far: dict[str, int] = {}
        for _, members, flagged in self._steps:
            for m in members:
                judged[m] = judged.get(m, 0) + 1
                far[m] = far.get(m, 0) + (m in flagged)
        suspects = (len(judged) - 1) // 2  # fewer than half: an honest majority holds
        others = [m for m in judged if m != member]
        kept = sorted(others, key=lambda m: (-far[m] / judged[m], m))[suspects:]
        return ((sum(far[m] for m in kept) + PRIOR_FAR)
                / (sum(judged[m] for m in kept) + PRIOR_STEPS))

    def in_a_row(self, member: str) -> int:
        """Far steps in a row ending at the last recorded step in which ``member`` was
        judged (a step it was not judged in neither breaks nor extends the run)."""
        count = 0
        for _, members, flagged in reversed(self._steps):
            if member not in members:
                continue
            if member not in flagged:
                break
            count += 1
        return count

    def state_dict(self) -> dict[str, Any]:
        return {"steps": [[s, list(m), sorted(f)] for s, m, f in self._steps]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._steps = deque(((int(s), tuple(m), frozenset(f))
                             for s, m, f in state.get("steps", [])), maxlen=self.window)


def needed(rate: float, least: int, false_positive: float) -> int:
    """Far steps in a row that quarantine: the least ``k >= least`` with
    ``rate ** k <= false_positive`` (at most ``MOST_IN_A_ROW``)."""
    if rate <= 0:
        return least
    if rate >= 1:
        return MOST_IN_A_ROW
    k = math.ceil(math.log(false_positive) / math.log(rate) - 1e-9)
    return max(least, min(k, MOST_IN_A_ROW))
