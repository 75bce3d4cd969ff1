"""A round's start, kept so that the round can be voided (Streaming DiLoCo, elastic).

Streaming DiLoCo applies fragments 0 .. P-2 while the round goes on. If a member is
lost after that, those fragments hold its samples, and the round cannot be committed
without them. So the round is voided: the global parameters, the outer optimizer's
state and the error feedback go back to what they were when the round began, and the
whole round is handed out again. ``RoundStart`` is that state, taken once a round, only
where a round can be voided (an elastic cohort).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from potluck.compress import ErrorFeedback


@dataclass(frozen=True)
class RoundStart:
    """The committed state a round began from (copies: the round changes the originals)."""

    global_: list[torch.Tensor]
    outer: dict[str, Any]
    feedback: dict[str, torch.Tensor] | None

    @classmethod
    def take(cls, global_: Sequence[torch.Tensor], outer: torch.optim.Optimizer,
             feedback: ErrorFeedback | None) -> RoundStart:
        return cls([value.detach().clone() for value in global_],
                   copy.deepcopy(outer.state_dict()),
                   feedback.snapshot() if feedback is not None else None)

    def outer_state(self) -> dict[str, Any]:
        """A copy of the outer optimizer's state: torch's optimizer keeps the tensors it
        is given, so the kept ones must never be handed out."""
        return copy.deepcopy(self.outer)

    def restore(self, global_: Sequence[torch.Tensor], outer: torch.optim.Optimizer,
                feedback: ErrorFeedback | None) -> None:
        """Put the round's start back: the fragments applied since are undone."""
        with torch.no_grad():
            for value, saved in zip(global_, self.global_, strict=True):
                value.copy_(saved)
        outer.load_state_dict(self.outer_state())
        if feedback is not None and self.feedback is not None:
            feedback.restore(self.feedback)


@dataclass(frozen=True)
class VoidedRound:
    """A round voided by a member's loss (Streaming DiLoCo on an elastic cohort)."""

    index: int  # the round's number: rounds committed before it, plus one
    applied: int  # fragments this rank had applied when the loss surfaced (rolled back)
    cause: str  # the collective that failed, as this rank saw it
