"""The parameters dealt into fragments, and one fragment's outer step (pure tensors).

Streaming DiLoCo syncs the model in ``P`` fragments in turn. Tensors are dealt out in
turn (tensor i to fragment ``i % P``: strided, so every fragment holds some of the
early and some of the late layers). DiLoCo is the one-fragment case: the same code
syncs the whole model at the round's end.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from potluck.errors import ConfigError

Summed = list[tuple[list[int], torch.Tensor]]  # (parameter indices, their flat sum)


def deal(count: int, fragments: int) -> list[list[int]]:
    """Parameter indices ``0 .. count-1`` dealt into ``fragments`` non-empty fragments."""
    if fragments > count:
        raise ConfigError(
            f"DiLoCo(fragments={fragments}) for a model with {count} trainable parameter "
            f"tensor(s): every fragment needs one at least; use fragments <= {count}")
    return [list(range(f, count, fragments)) for f in range(fragments)]


def by_kind(params: Sequence[torch.Tensor], members: Sequence[int]) -> list[list[int]]:
    """``members`` grouped by (device, dtype): one flat buffer, one collective each."""
    kinds: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i in members:
        kinds.setdefault((params[i].device, params[i].dtype), []).append(i)
    return list(kinds.values())


def pseudo_gradient(global_: Sequence[torch.Tensor], params: Sequence[torch.Tensor],
                    members: Sequence[int]) -> torch.Tensor:
    """``global - local`` of ``members``, flattened into one new tensor."""
    return torch.cat([(global_[i] - params[i]).reshape(-1) for i in members])


def outer_step(global_: Sequence[torch.Tensor], params: Sequence[torch.Tensor],
               outer: torch.optim.Optimizer, sums: Summed, mixing: float) -> bool:
    """The outer optimizer steps the global parameters of the summed members (the others
    keep theirs: their gradient is None), then each replica merges them in:
    ``local = mixing * local + (1 - mixing) * global``. A sum that is not finite (the same
    on every rank: the same decision) skips the outer step; the merge still happens.
    Returns whether the step was taken."""
    with torch.no_grad():
        for value in global_:
            value.grad = None
        for members, summed in sums:
            offset = 0
            for i in members:
                n = global_[i].numel()
                global_[i].grad = summed[offset:offset + n].view_as(global_[i])
                offset += n
        finite = all(bool(torch.isfinite(summed).all()) for _, summed in sums)
        if finite:
            outer.step()
        for members, _ in sums:
            for i in members:
                if mixing:
                    params[i].mul_(mixing).add_(global_[i], alpha=1 - mixing)
                else:
                    params[i].copy_(global_[i])
    return finite
