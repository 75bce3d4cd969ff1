"""A member's inner optimizer as bytes, and an optimizer of the same kind to re-run it.

The inner optimizer (the user's: SGD with momentum, AdamW) keeps its state across
rounds under DiLoCo, so re-running a member's local steps needs the state it started
the round with. ``Taken`` is that state at a round's start: the optimizer's tensors in
a fixed order (its parameters in order, each one's keys sorted), and its groups'
options. ``pack`` lays the tensors out as raw bytes; ``unpack`` reads bytes back by
another member's layout, never by anything the sender says about them (no pickle
crosses between members). ``rerun_optimizer`` builds a fresh optimizer of the user's
class on new leaves, with the options and state given.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from potluck.errors import ConfigError


@dataclass(frozen=True)
class Taken:
    """The inner optimizer at a round's start: ``tensors`` as ``(parameter index, key,
    value)`` (copies), and each group's options without its parameters."""

    tensors: tuple[tuple[int, str, torch.Tensor], ...]
    options: tuple[dict[str, Any], ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, _, t in self.tensors)


def optimizer_parameters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters in order, group by group."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def take(optimizer: torch.optim.Optimizer) -> Taken:
    """Copies of the optimizer's state tensors and of its groups' options."""
    tensors = []
    for index, param in enumerate(optimizer_parameters(optimizer)):
        state = optimizer.state.get(param, {})
        tensors += [(index, key, state[key].detach().clone()) for key in sorted(state)
                    if isinstance(state[key], torch.Tensor)]
    options = tuple({k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
                    for group in optimizer.param_groups)
    return Taken(tuple(tensors), options)


def digest(raw: torch.Tensor) -> bytes:
    """The blake2b digest (32 bytes) of ``raw``, a uint8 tensor on the CPU."""
    return hashlib.blake2b(raw.numpy().tobytes(), digest_size=32).digest()


def as_bytes(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors' raw bytes, one after another, as one uint8 tensor on the CPU."""
    if not tensors:
        return torch.empty(0, dtype=torch.uint8)
    return torch.cat([t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                      for t in tensors])


def unpack(raw: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``raw`` (uint8) read as tensors shaped, typed and placed as ``like``, in order;
    ``raw`` must hold exactly their bytes."""
    out, at = [], 0
    for t in like:
        n = t.numel() * t.element_size()
        piece = raw[at:at + n].clone()
        out.append(piece.view(t.dtype).view(t.shape).to(t.device))
        at += n
    if at != raw.numel():
        raise ValueError(f"{raw.numel()} bytes for a layout of {at}")
    return out


def rerun_optimizer(optimizer: torch.optim.Optimizer, leaves: Sequence[torch.Tensor],
                    taken: Taken, values: Sequence[torch.Tensor]) -> torch.optim.Optimizer:
    """A fresh optimizer of ``optimizer``'s class on ``leaves`` (its parameters' stand-
    ins, in order), with ``taken``'s options and ``values`` as its state tensors."""
    groups, at = [], 0
    for options, group in zip(taken.options, optimizer.param_groups, strict=True):
        size = len(group["params"])
        groups.append({**copy.deepcopy(options), "params": list(leaves[at:at + size])})
        at += size
    try:
        fresh = type(optimizer)(groups)  # type: ignore[call-arg]
    except TypeError as exc:
        raise ConfigError(
            f"SpotCheck under rounds re-runs local steps with a new "
            f"{type(optimizer).__name__}(param_groups), which raised {exc}: use an "
            "optimizer that takes its options in its param groups (torch.optim's do), "
            "or drop spot_check=") from exc
    for (index, key, _), value in zip(taken.tensors, values, strict=True):
        fresh.state[leaves[index]][key] = value
    return fresh
