"""A sender's copy that is bit for bit one it sent before: a replayed gradient.

An honest rank's gradient changes every step (other samples, other parameters), so a
copy of a slice whose bits repeat one of the same sender's last ``memory`` copies of
that slice was replayed: a lazy or stale worker resending an old gradient. Each owner
keeps two 32-bit sums of each copy's bit patterns per bucket and sender (no tensors) and
flags repeats in its report; the verdict goes by the owners' majority.

Not flagged: a copy that is all zeros (a rank with no samples in the step, or a slice
of parameters it did not use) or from a rank with no weight in the step; and the
verdict flags nobody when most senders repeat (a slice that stopped changing for
everyone). A replay perturbed by a single bit is not a repeat, nor one of a copy older
than ``memory`` steps: those are left to the spot checks (``spot.py``).
"""

from __future__ import annotations

from collections import deque

import torch

from potluck.trust.fingerprint import word_sums


class ReplayWatch:
    """Per (bucket, sender), the sums of its last ``memory`` copies."""

    def __init__(self, memory: int = 50) -> None:
        self.memory = memory
        self._seen: dict[tuple[int, int], deque[int]] = {}

    def check(self, bucket: int, senders: tuple[int, ...], rows: torch.Tensor,
              weights: torch.Tensor) -> list[bool]:
        """Whether each sender's copy (row of ``rows``, ``[senders, values]``) repeats one
        of its last copies of this bucket; then remembers them."""
        sums = _sums(rows)
        flagged = []
        for row, (sender, total, weight) in enumerate(zip(senders, sums, weights.tolist(),
                                                          strict=True)):
            seen = self._seen.setdefault((bucket, sender), deque(maxlen=self.memory))
            repeat = weight > 0 and total in seen  # (all zeros? asked of a repeat only)
            flagged.append(bool(repeat and not _zero_rows(rows[row:row + 1])[0]))
            seen.append(total)
        return flagged

    def forget(self) -> None:
        """A new generation renumbers the ranks: start over."""
        self._seen.clear()


def _sums(rows: torch.Tensor) -> list[int]:
    """Each row's bit patterns as 64 bits: the wrapping 32-bit sums of its two halves
    (``fingerprint.word_sums``, reading the rows in place)."""
    if rows.numel() == 0:
        return [0] * rows.shape[0]
    return [(first & 0xFFFF_FFFF) << 32 | (second & 0xFFFF_FFFF)
            for first, second in word_sums(rows, dim=1).tolist()]


def _zero_rows(rows: torch.Tensor) -> list[bool]:
    """Whether each row is all (positive or negative) zeros: its largest and smallest
    values are (a NaN makes them NaN; two passes that keep nothing, unlike ``== 0``)."""
    if rows.numel() == 0:
        return [True] * rows.shape[0]
    return ((rows.amax(1) == 0) & (rows.amin(1) == 0)).tolist()
