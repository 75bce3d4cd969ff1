"""Small collective helpers over an explicit process-group object.

Every function takes the group it talks on; none reaches for the default group. The
group may be a ``torch.distributed.ProcessGroup`` or a backend object such as
``ProcessGroupGloo``: both expose ``rank()``, ``size()`` and the list-of-tensor
collectives used here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

# A process group or a c10d backend object; both are used through the same methods.
Group = Any


def default_group() -> Group | None:
    """The default process group if one was initialized, else None (single process)."""
    if dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_group()
    return None


def broadcast_coalesced(tensors: Sequence[torch.Tensor], group: Group, src: int = 0) -> None:
    """Broadcast ``tensors`` from rank ``src`` in place, one flat message per dtype/device."""
    for flat, members in _flatten_groups(tensors):
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        group.broadcast([flat], opts).wait()
        _unflatten_into(flat, members)


class PendingBroadcast:
    """An in-flight coalesced broadcast; ``wait()`` copies the result into the tensors."""

    def __init__(self, tensors: Sequence[torch.Tensor], group: Group, src: int = 0) -> None:
        self._parts = _flatten_groups(tensors)
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self._works = [group.broadcast([flat], opts) for flat, _ in self._parts]

    def wait(self) -> None:
        for work, (flat, members) in zip(self._works, self._parts, strict=True):
            work.wait()
            _unflatten_into(flat, members)


def allgather_tensor(tensor: torch.Tensor, group: Group) -> list[torch.Tensor]:
    """Every rank's copy of ``tensor`` (same shape and dtype on every rank), in rank order."""
    outputs = [torch.empty_like(tensor) for _ in range(group.size())]
    group.allgather([outputs], [tensor]).wait()
    return outputs


def _flatten_groups(
    tensors: Sequence[torch.Tensor],
) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    grouped: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for tensor in tensors:
        grouped[(tensor.device, tensor.dtype)].append(tensor)
    parts = []
    for members in grouped.values():
        flat = torch.cat([t.detach().reshape(-1) for t in members])
        parts.append((flat, members))
    return parts


def _unflatten_into(flat: torch.Tensor, members: list[torch.Tensor]) -> None:
    offset = 0
    with torch.no_grad():
        for tensor in members:
            numel = tensor.numel()
            tensor.copy_(flat[offset : offset + numel].view_as(tensor))
            offset += numel
