"""Spot checks: the slice owners recompute one rank's gradient on its own samples.

After a step, a hash of the step's reports (which no rank knew when it sent its copy)
may pick a *target*. Every other owner then recomputes the target's gradient: the same
parameters (a snapshot taken before the update, on the steps a check picks only), the same
samples (the exactly-once cursor knows which each rank trained on), the user's
``loss(model, batch)``. Each compares it with the copy the target sent it, on its own
slices, and reports the relative difference in the next step's report; the verdict is
the majority of the owners that checked (``verdict.py``). A stale replay, a gradient of
other data, or one computed by other code differs; an honest rank's differs only by
float rounding.

The recomputation runs on a functional copy of the model (``torch.func.functional_call``
with cloned parameters and buffers), so the model, its hooks and BatchNorm statistics
are untouched, and under ``torch.random.fork_rng``, so the training's random stream is
too. The loss must therefore be deterministic given the parameters and the batch (no
dropout, or a fixed seed inside it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from potluck.errors import ConfigError

Loss = Callable[[Callable[..., Any], Any], torch.Tensor]  # loss(model, batch) -> scalar


@dataclass(frozen=True)
class SpotCheck:
    """``loss(model, batch)``: the scalar the training loop calls ``backward()`` on, for
    one rank's batch as the loader yields it (the mean over its samples), e.g.
    ``lambda model, batch: F.cross_entropy(model(batch[0]), batch[1])``.
    ``every``: on average one step in K is checked (each check costs every other owner
    one forward and backward of the target's part). ``tolerance``: the relative L2
    difference on an owner's slices above which the copy is wrong.

    Under rounds (``sync=DiLoCo(...)``) the same setting is the spot re-run
    (``round_rerun.py``): on average one round in ``every`` is checked, ``checkers``
    members re-run the target's first ``steps`` local steps from the round's start, and
    ``tolerance`` is the relative L2 difference of its parameters' change over them
    that is still honest. The target is struck when more than half the checkers find it
    off. Every step ignores ``steps`` and ``checkers``."""

    loss: Loss
    every: int = 8
    tolerance: float = 1e-3
    steps: int = 4
    checkers: int = 3

    def __post_init__(self) -> None:
        if not callable(self.loss):
            raise ConfigError(f"SpotCheck(loss={self.loss!r}) must be a callable "
                              "loss(model, batch) -> scalar tensor")
        if isinstance(self.every, bool) or not (isinstance(self.every, int) and self.every >= 1):
            raise ConfigError(f"SpotCheck(every={self.every!r}) must be an int >= 1 (one "
                              "checked step in K on average)")
        if not (isinstance(self.tolerance, float) and 0 < self.tolerance < 1):
            raise ConfigError(f"SpotCheck(tolerance={self.tolerance!r}) must be a float in "
                              "(0, 1): the relative difference an honest recomputation "
                              "stays under, e.g. 1e-3")
        for name, least, what in (("steps", 1, "the local steps a round's re-run takes, e.g. 4"),
                                  ("checkers", 1, "members that re-run a checked round, e.g. 3")):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int) and value >= least):
                raise ConfigError(f"SpotCheck({name}={value!r}) must be an int >= {least} "
                                  f"({what})")


def snapshot(module: nn.Module, buffers: dict[str, torch.Tensor] | None = None
             ) -> dict[str, torch.Tensor]:
    """The parameters and buffers, detached copies, by name; ``buffers``: copies taken
    earlier (``buffer_copy``) to use instead of the buffers as they are now. ``TrustPart``
    copies the buffers at each step's first bucket (as the rank's own forward left them,
    before the pass's end broadcasts rank 0's), and the parameters only on a step it
    spot-checks, before the update; it drops the snapshot after the check."""
    copied = {name: p.detach().clone() for name, p in module.named_parameters()}
    copied.update(buffer_copy(module) if buffers is None else buffers)
    return copied


def buffer_copy(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's buffers, detached copies, by name (few and small in most models)."""
    return {name: b.detach().clone() for name, b in module.named_buffers()}


def recompute_gradient(module: nn.Module, state: dict[str, torch.Tensor], loss: Loss,
                       batch: Any, wanted: Collection[str] | None = None
                       ) -> dict[str, torch.Tensor]:
    """The gradient of ``loss`` at ``state`` on ``batch``, by parameter name (zeros for
    a parameter the loss does not reach). ``wanted``: only these parameters' gradients
    are computed (the others are zeros): an owner compares only its own slices, and
    backward then skips the other layers' weight gradients, and stops at the first
    layer it needs. All zeros when the loss reaches none of them (and, with none
    wanted, the loss is not called at all)."""
    names = [name for name, _ in module.named_parameters()]
    asked = names if wanted is None else [name for name in names if name in wanted]
    # (copies: a forward may write its module's tensors, BatchNorm its statistics, an
    # Embedding(max_norm=...) its weight, and each recomputation starts from the step's)
    leaves = {name: state[name].clone().requires_grad_(True) for name in asked}
    if not leaves:
        return {name: torch.zeros_like(state[name]) for name in names}
    values = {**{k: v.clone() for k, v in state.items() if k not in leaves}, **leaves}

    def model(*args: Any, **kwargs: Any) -> Any:
        return torch.func.functional_call(module, values, args, kwargs)

    devices = [state[names[0]].device] if names and state[names[0]].is_cuda else []
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        value = loss(model, batch)
        if not (isinstance(value, torch.Tensor) and value.numel() == 1):
            raise ConfigError(f"SpotCheck's loss(model, batch) returned {type(value).__name__}"
                              f"{tuple(value.shape) if isinstance(value, torch.Tensor) else ''}"
                              "; it must return the scalar loss the loop calls backward() on")
        grads = (dict(zip(asked, torch.autograd.grad(value, [leaves[n] for n in asked],
                                                     allow_unused=True), strict=True))
                 if value.requires_grad else {})  # (none of them reached)
    return {n: torch.zeros_like(state[n]) if grads.get(n) is None else grads[n].detach()
            for n in names}


def in_slices(buckets: Sequence[tuple[Sequence[int], int, Sequence[torch.Tensor]]],
              me: int) -> list[torch.Tensor]:
    """The parameters with a value in one of owner ``me``'s slices: per bucket
    ``(owners, piece, parameters)``, the parameters laid out one after another in the
    bucket's order, owner k's slice ``[k * piece, (k + 1) * piece)``."""
    found: list[torch.Tensor] = []
    for owners, piece, parameters in buckets:
        if me not in owners:
            continue
        start = owners.index(me) * piece
        at = 0
        for p in parameters:
            if at < start + piece and at + p.numel() > start:
                found.append(p)
            at += p.numel()
    return found


def slice_error(flat: torch.Tensor, copy: torch.Tensor, start: int,
                slack: torch.Tensor | None = None) -> tuple[float, float]:
    """``(squared difference, squared norm)`` of the recomputed ``flat`` gradient of one
    bucket against ``copy``, the target's values at ``[start, start + len(copy))``
    (past the end of ``flat`` both are padding). ``slack``: per value of ``copy``, a
    difference it may have honestly (a codec's rounding, ``spot_coded.py``); only what
    lies beyond it counts."""
    mine = flat[start:start + copy.numel()].float()
    theirs = copy[:mine.numel()].float()
    gap = (mine - theirs).abs()
    if slack is not None:
        gap = (gap - slack[:mine.numel()].float()).clamp_(min=0)
    diff = float(gap.pow(2).sum())
    return (diff if math.isfinite(diff) else math.inf), float(mine.pow(2).sum())


def relative(parts: Sequence[tuple[float, float]]) -> float:
    """The relative L2 difference over several slices."""
    diff, norm = sum(p[0] for p in parts), sum(p[1] for p in parts)
    return math.sqrt(diff / norm) if norm > 0 else (0.0 if diff == 0 else math.inf)
