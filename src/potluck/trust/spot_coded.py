"""A spot check through a codec: how far an honest copy may be from its gradient.

Through a codec with error feedback (``lanes.Coded``) a sender encodes ``s = g + e``,
its gradient ``g`` plus the residual ``e`` its last encoding left, and keeps the new
residual ``s - Q(s)``. So the decoded copy is ``Q(s) = g + e - (s - Q(s))``: it is off
from the gradient by this step's rounding and the last step's, both bounded per value
by what the codec rounds (``compress.Bounded``), and the checker reads both bounds from
decoded copies it holds: this step's, and the copy the same sender sent it of the same
slice in the last committed step (``SentBefore`` keeps those, encoded: for int8 a quarter
of a gradient's bytes per rank). A spot check then counts only what lies beyond that
allowance (``spot.slice_error``'s ``slack``): an honest copy is within it, up to float
rounding; a copy of another gradient, a replay or a gradient of other data is off by
far more than a rounding step on most values.

Without a last step to read from (the first step of a generation: ranks were
renumbered, slices cut anew) the residual is unknown, and the check is skipped.
What is not caught: a sender that moves each value by less than the allowance (a
rounding step), which is what the codec may do to an honest copy anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from potluck.compress import Bounded
from potluck.trust.exchange import Kept
from potluck.trust.lanes import Coded


@dataclass(frozen=True)
class _Sent:
    """One bucket of a committed step: its layout, and the copies as they travelled."""

    layout: tuple[object, ...]
    copies: torch.Tensor  # [senders, width]: the senders' copies of this owner's slice
    mine: torch.Tensor  # [owners, width]: this rank's copy of every owner's slice


def _layout(kept: Kept) -> tuple[object, ...]:
    return (kept.owners, kept.senders, kept.piece, tuple(id(p) for p in kept.parameters))


class SentBefore:
    """Per bucket, the copies of the last committed step (``keep`` after a check)."""

    def __init__(self, lanes: Coded) -> None:
        if not isinstance(lanes.codec, Bounded):
            raise TypeError(f"codec {lanes.codec.name} bounds no value's rounding")
        self.lanes, self._rounding = lanes, lanes.codec
        self._sent: dict[int, _Sent] = {}

    def keep(self, kept: list[Kept]) -> None:
        """The step committed: its copies bound the next step's residuals."""
        if self.lanes.feedback is None:
            return  # (no residual: this step's rounding is the whole allowance)
        self._sent = {i: _Sent(_layout(k), k.copies.clone(), k.mine.clone())
                      for i, k in enumerate(kept)}

    def forget(self) -> None:
        """A new generation: the slices are cut anew."""
        self._sent.clear()

    def copy_of(self, index: int, kept: Kept, sender: int
                ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``sender``'s decoded copy of this owner's slice of bucket ``index``, and its
        allowance per value; None when the last step's copy is unknown."""
        row = kept.senders.index(sender)
        known, before = self._before(index, kept)
        if not known:
            return None
        decoded, slack = self._decoded(kept.copies[row:row + 1], kept.piece)
        if before is not None:
            slack += self._decoded(before.copies[row:row + 1], kept.piece)[1]
        return decoded.reshape(-1), slack.reshape(-1)

    def mine(self, index: int, kept: Kept) -> tuple[torch.Tensor, torch.Tensor] | None:
        """This rank's own copy of bucket ``index``, decoded and laid out as the bucket
        (every owner's slice in turn), with its allowance; None as ``copy_of``."""
        known, before = self._before(index, kept)
        if not known:
            return None
        decoded, slack = self._decoded(kept.mine, kept.piece)
        if before is not None:
            slack += self._decoded(before.mine, kept.piece)[1]
        return decoded.reshape(-1), slack.reshape(-1)

    def _before(self, index: int, kept: Kept) -> tuple[bool, _Sent | None]:
        """Whether the last step's residual is bounded, and the record that bounds it
        (None: without error feedback there is no residual)."""
        if self.lanes.feedback is None:
            return True, None
        sent = self._sent.get(index)
        known = sent is not None and sent.layout == _layout(kept)
        return known, sent if known else None

    def _decoded(self, rows: torch.Tensor, piece: int) -> tuple[torch.Tensor, torch.Tensor]:
        decoded = self.lanes.copies(rows.contiguous(), piece)
        slack = torch.stack([self._rounding.rounding(row) for row in decoded])
        return decoded, slack
