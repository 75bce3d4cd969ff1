"""Byzantine attacks on one rank's pseudo-gradients, for the rounds bench and tests.

``RoundAttack`` wraps a round sum (``potluck.sync.round_sum``). Every rank registers
it; on the attacker's rank it rewrites the piece's delta before the wrapped round sum
sends it. That is what a worker running modified code could put on the wire. The
omniscient attacks see every member's true delta: every rank joins one all-gather of
them, so every rank issues the same collectives. ``rewrite`` is the pure part: the
delta an attack sends, given this rank's own and what it saw. ``other_labels`` is the
attack that changes the data, not the delta: the attacker trains on wrong labels.
It is lab code, not training API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.futures import Future

from potluck.group import ProcessGroupLike
from potluck.sync.round_sum import Piece, RoundSum

ROUND_ATTACKS = ("sign_flip", "noise", "nan", "alie", "ipm", "free_rider",
                 "free_rider_scaled", "copy", "replay", "other_data")
OMNISCIENT = ("alie", "ipm", "copy")  # they read the other members' true deltas


@dataclass(frozen=True)
class Strength:
    """How hard each attack pushes."""

    flip: float = -10.0  # sign_flip: the delta times this
    noise: float = 100.0  # noise: Gaussian, this many times the delta's RMS
    z: float = 1.0  # alie: the honest mean minus z standard deviations
    epsilon: float = 0.5  # ipm: -epsilon times the honest mean
    free_scale: float = 0.1  # free_rider_scaled: the delta times this


@dataclass(frozen=True)
class View:
    """What the attacker knows when it rewrites a delta: the other members' true deltas
    in rank order (omniscient attacks only, else empty), and its own delta of the last
    round (None in the first)."""

    honest: Sequence[torch.Tensor] = ()
    previous: torch.Tensor | None = None


def rewrite(name: str, delta: torch.Tensor, view: View, generator: torch.Generator,
            strength: Strength = Strength()) -> torch.Tensor:
    """The delta attack ``name`` sends in place of ``delta`` (a new tensor)."""
    if name == "sign_flip":
        return delta * strength.flip
    if name == "noise":
        rms = max(float(delta.float().pow(2).mean().sqrt()), 1e-3)
        noise = torch.randn(delta.shape, generator=generator).to(delta)
        return delta + noise * strength.noise * rms
    if name == "nan":
        return torch.full_like(delta, float("nan"))
    if name in OMNISCIENT:
        if not view.honest:
            raise ValueError(f"attack {name!r} reads the other members' deltas: none given")
        honest = torch.stack(list(view.honest))
        if name == "alie":  # (one honest delta has no spread: the mean alone)
            spread = honest.std(0) if len(honest) > 1 else torch.zeros_like(delta)
            return honest.mean(0) - strength.z * spread
        if name == "ipm":
            return honest.mean(0) * -strength.epsilon
        return honest[0].clone()  # copy: the lowest-ranked other member's
    if name == "free_rider":
        return torch.zeros_like(delta)
    if name == "free_rider_scaled":
        return delta * strength.free_scale
    if name == "replay":
        return delta.clone() if view.previous is None else view.previous.clone()
    if name == "other_data":
        return delta.clone()  # the delta is honest; its data was not (other_labels)
    raise ValueError(f"attack {name!r}: one of {', '.join(ROUND_ATTACKS)}")


def first_round(name: str) -> int:
    """The first round whose delta the attack changes (a replay needs a last round)."""
    return 2 if name == "replay" else 1


def other_labels(labels: torch.Tensor, classes: int) -> torch.Tensor:
    """The labels of another task: each class moved to the next one, so the attacker
    learns a consistent wrong mapping (its loader still advances as an honest one)."""
    return (labels + 1) % classes


class RoundAttack:
    """``name`` on this rank when ``active`` (else a pass-through), then ``inner``.

    Register it on every rank (``DiLoCoSync.register_round_sum``) with the same name:
    the omniscient attacks all-gather every member's true delta on ``group``."""

    def __init__(self, inner: RoundSum, name: str, active: bool, *, seed: int = 0,
                 strength: Strength = Strength()) -> None:
        if name not in (*ROUND_ATTACKS, "none"):
            raise ValueError(f"attack {name!r}: one of {', '.join(ROUND_ATTACKS)} or none")
        self.inner, self.name, self.active, self.strength = inner, name, active, strength
        self._previous: dict[str, torch.Tensor] = {}  # this rank's true delta, per key
        self._gen = torch.Generator().manual_seed(seed)

    def __call__(self, piece: Piece, group: ProcessGroupLike) -> Future[torch.Tensor]:
        if self.name == "none":
            return self.inner(piece, group)
        honest: list[torch.Tensor] = []
        if self.name in OMNISCIENT:  # every rank takes part in the oracle's all-gather
            rows = [torch.empty_like(piece.delta) for _ in range(group.size())]
            group.allgather([rows], [piece.delta]).wait()
            honest = [row for i, row in enumerate(rows) if i != group.rank()]
        if self.active:
            view = View(honest, self._previous.get(piece.key))
            self._previous[piece.key] = piece.delta.clone()
            piece.delta.copy_(rewrite(self.name, piece.delta, view, self._gen, self.strength))
        return self.inner(piece, group)
