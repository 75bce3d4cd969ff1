"""How a round's pseudo-gradients are combined across the members: a seam.

``DiLoCoSync`` hands each collective's worth of this rank's pseudo-gradient to its
``RoundSum`` as a ``Piece``: one fragment's tensors of one (device, dtype), flattened.
The round sum returns a future of the combined pseudo-gradient, the same tensor on every
member. ``CodecSum``, the default, is the weighted sum through the round's codec
(``potluck.compress.start_sum``). Another one plugs in with
``DiLoCoSync.register_round_sum`` (a robust aggregator, or the lab's attacks, which wrap
the one in place), as a comm hook does for every-step sync.

A round sum must issue the same collectives in the same order on every member, and
raise (or fail its future) where a peer is lost, before anything it keeps changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch.futures import Future

from potluck.compress.codec import Codec
from potluck.compress.exchange import Traffic, start_sum
from potluck.compress.feedback import ErrorFeedback
from potluck.group import ProcessGroupLike


@dataclass(frozen=True)
class Piece:
    """One collective's worth of this rank's pseudo-gradient.

    ``delta``: ``global - local`` of the fragment's tensors of one (device, dtype),
    flattened (a new tensor the round sum may change). ``share``: this rank's weight in
    the round, its samples over the round's (``round_plan.weight``). ``key``: a name
    stable across rounds (error feedback is kept under it). ``fragment``: which fragment
    (0 for DiLoCo), ``round``: the round's number, from 1. ``members``: the parameter
    indices the values come from, in order. ``shares``: every member's weight in the
    round, by rank, from the parts of the round's block the members were assigned (the
    round's last piece; empty for a piece sent mid-round, before they are known).
    ``parts``: every member's parts of the round's block, by rank, as ``[start, stop)``
    positions in the epoch (the round's last piece, as ``shares``)."""

    delta: torch.Tensor
    share: float
    key: str
    fragment: int
    round: int
    members: tuple[int, ...]
    shares: tuple[float, ...] = ()
    parts: tuple[tuple[tuple[int, int], ...], ...] = ()


class RoundSum(Protocol):
    """The members' pseudo-gradients combined: ``sum(share_i * delta_i)`` for the mean,
    or a robust stand-in for it. The future's value is a tensor like ``piece.delta``."""

    def __call__(self, piece: Piece, group: ProcessGroupLike) -> Future[torch.Tensor]: ...


class CodecSum:
    """The weighted sum through ``codec``, with this rank's error feedback (None: what
    the codec drops is lost); ``traffic`` counts the bytes sent."""

    def __init__(self, codec: Codec, feedback: ErrorFeedback | None,
                 traffic: Traffic) -> None:
        self.codec, self.feedback, self.traffic = codec, feedback, traffic

    def __call__(self, piece: Piece, group: ProcessGroupLike) -> Future[torch.Tensor]:
        return start_sum(piece.delta.mul_(piece.share), self.codec, group,
                         feedback=self.feedback, key=piece.key, traffic=self.traffic)
