"""A guarded optimizer step: clip after averaging, skip non-finite steps on every rank.

``GuardedOptimizer(opt, ...)`` keeps the user's loop ordinary (``backward``,
``opt.step()``, ``opt.zero_grad()``). ``step()`` runs after ``backward()`` has returned
averaged gradients (potluck.DataParallel guarantees that), then:

1. unscales fp16 gradients if a ``GradScaler`` is given;
2. computes the global gradient norm (one pass), and decides whether it is finite;
3. makes that decision the same on every rank: a one-scalar all-reduce (MAX) on
   ``group`` (the finiteness vote), unless ``agree`` says no vote is needed. ``agree``
   is a bool or a callable asked at each step: ``prepare`` passes the reducer's
   ``agreed_result`` (its built-in all-reduce hooks give every rank the same bits, so
   every rank decides alike alone, and a step saves the vote's round trip; a custom
   hook gets the vote). ``agree=False``: each rank decides alone (trust does so, since
   a vote is one any rank can decide, and every rank holds the same aggregates);
4. on a non-finite step, every rank skips the update together, logs it and counts it
   (a scaler backs off its scale identically on every rank);
5. otherwise clips to ``clip_grad_norm`` (if set) and steps.

A step whose collectives failed (a ``DataParallel`` with ``on_failure="abandon"``) is
not applied at all: the step transaction (``potluck.step.transaction``) checks that
before it calls ``step()``, and a finiteness vote that fails on a recoverable (elastic)
group returns ``StepResult.failed`` so the transaction redoes the step.

The returned ``StepResult`` says whether the step committed; the data cursor advances
either way (a NaN batch is skipped, counted and logged, not retried forever).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from potluck.collectives import Group, allreduce_max, default_group
from potluck.errors import ConfigError, PeerLostError
from potluck.group import GroupHandle, as_handle

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepResult:
    """What one ``step()`` did: ``committed`` is False when the step was skipped."""

    committed: bool
    grad_norm: float
    failed: bool = False  # the step's collectives failed: abandoned, to be redone


class GuardedOptimizer:
    """Wraps a ``torch.optim.Optimizer``; pass ``.optimizer`` to LR schedulers."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        clip_grad_norm: float | None = None,
        scaler: torch.amp.GradScaler | None = None,
        group: Group | None = None,
        agree: bool | Callable[[], bool] = True,
        recoverable: bool = False,
    ) -> None:
        """``agree``: whether the ranks vote on finiteness (a callable: asked at each
        step; see the module's docstring). ``recoverable``: a failed finiteness vote
        returns ``StepResult(failed=True)`` (the elastic transaction redoes the step)
        instead of raising ``PeerLostError``."""
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ConfigError(
                f"clip_grad_norm must be a positive number or None, got {clip_grad_norm!r}"
            )
        self.optimizer = optimizer
        self.clip_grad_norm = clip_grad_norm
        self.scaler = scaler
        self._group: GroupHandle | None = as_handle(
            group if group is not None else default_group())
        self._agree = agree
        self._recoverable = recoverable
        self._aliases = {id(self)}  # ids of what stands for it in the loop (alias)
        self.steps = 0
        self.skipped = 0
        self.failed = 0

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> StepResult:
        if self.scaler is not None and not _unscaled(self.scaler, self.optimizer,
                                                     self._aliases):
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self._parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        norm = float(total)
        try:
            finite = self._agreed_finite(math.isfinite(norm))
        except PeerLostError as exc:  # a peer died between backward and step
            if not self._recoverable:
                raise
            self.forget_unscale()  # the redo's gradients are scaled afresh
            self.failed += 1
            log.warning("step not applied: the finiteness vote failed: %s", exc)
            return StepResult(committed=False, grad_norm=norm, failed=True)
        self.steps += 1
        if not finite:
            self.skipped += 1
            where = "on this rank" if self._agree is False else "on every rank"
            log.warning("step %d skipped %s: gradient norm is %s (%d skipped so far)",
                        self.steps, where, norm, self.skipped)
            if self.scaler is not None:
                self.scaler.update(self.scaler.get_scale() * self.scaler.get_backoff_factor())
            return StepResult(committed=False, grad_norm=norm)
        if self.clip_grad_norm is not None and grads:
            torch.nn.utils.clip_grads_with_norm_(
                self._parameters(), self.clip_grad_norm, total
            )
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        return StepResult(committed=True, grad_norm=norm)

    def forget_unscale(self) -> None:
        """A step that is not applied (its collectives failed; it is redone): the
        scaler's record that this step's gradients were unscaled goes, so the redo's
        gradients, scaled afresh, are unscaled in their turn (and a loop that unscales
        by hand may do so again)."""
        states = getattr(self.scaler, "_per_optimizer_states", None)
        if isinstance(states, dict):
            states.pop(id(self.optimizer), None)

    def alias(self, other: object) -> None:
        """``other`` stands for this optimizer in the loop (the step transaction): a
        scaler used on it is refused (``_unscaled``), one used on any other optimizer is
        not (one scaler for several optimizers, torch's recipe)."""
        self._aliases.add(id(other))

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "steps": self.steps,
                "skipped": self.skipped,
                "scaler": None if self.scaler is None else self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps, self.skipped = int(state["steps"]), int(state["skipped"])
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])

    def _parameters(self) -> Iterable[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _agreed_finite(self, finite: bool) -> bool:
        group = self._group
        agree = self._agree() if callable(self._agree) else self._agree
        if not agree or group is None or group.size() == 1:
            return finite
        device = next(iter(self._parameters()), torch.empty(0)).device
        flag = allreduce_max(torch.tensor([0.0 if finite else 1.0], device=device), group,
                             "the finiteness vote")
        return bool(flag.item() == 0.0)


def _unscaled(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer,
              aliases: set[int]) -> bool:
    """Whether the loop already unscaled this step's gradients by ``scaler`` (torch's
    recipe: ``scaler.unscale_(opt.optimizer)``, then clip by hand): then ``step()`` does
    not unscale again, as ``GradScaler.step`` does not. A scaler that unscaled, or
    stepped, what stands for this optimizer (``aliases``: ``scaler.step(opt)``,
    ``scaler.unscale_(opt)`` on ``prepare``'s optimizer) is refused: its gradients would
    be unscaled twice, and its ``update()`` would find no step of its own. Another
    optimizer's record is not this one's business (one scaler for several, torch's
    recipe). Reads the scaler's per-optimizer record (torch's own bookkeeping; a scaler
    without one is taken as not yet unscaled)."""
    states = getattr(scaler, "_per_optimizer_states", None)
    if not isinstance(states, dict):
        return False
    ready = getattr(getattr(torch.amp.grad_scaler, "OptState", None), "READY", None)
    if any(state.get("stage") is not ready
           for key, state in states.items() if key in aliases):
        raise ConfigError(
            "the GradScaler given to prepare(scaler=...) was used on another object this "
            "step (scaler.step(opt) or scaler.unscale_(opt) on prepare's optimizer): "
            "opt.step() unscales, skips a non-finite step, steps and updates the scaler "
            "itself. Write scaler.scale(loss).backward(); opt.step(), and leave out "
            "scaler.step() and scaler.update(); to clip, pass clip_grad_norm= to prepare, "
            "or call scaler.unscale_(opt.optimizer) before clipping by hand")
    mine = states.get(id(optimizer))
    return mine is not None and mine.get("stage") is not ready
