"""Small collective helpers over an explicit process-group object.

Every function takes the group it talks on; none reaches for the default group. The
group may be a ``torch.distributed.ProcessGroup`` or a backend object such as
``ProcessGroupGloo``: both expose ``rank()``, ``size()`` and the list-of-tensor
collectives used here.
"""

from __future__ import annotations

import pickle
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from potluck import tensor_pack
from potluck.errors import PeerLostError, PotluckError
from potluck.group import GroupHandle, ProcessGroupLike

# A process group, a c10d backend object or a ``GroupHandle``: used through the same
# methods (``ProcessGroupLike``).
Group = ProcessGroupLike


def default_group() -> Group | None:
    """The default process group if one was initialized, else None (single process)."""
    if dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_group()
    return None


def settle(issue: Callable[[], Any], group: Group, what: str,
           abandoned: Callable[[], bool] | None = None) -> Any:
    """Issue a collective of ``group`` (``issue()`` returns its work) and wait for it
    (``wait_for``)."""
    return wait_for(issued(issue, group, what), group, what, abandoned)


def issued(issue: Callable[[], Any], group: Group, what: str) -> Any:
    """The work of a collective of ``group`` that ``issue()`` starts, not waited for. A
    backend that already knows a peer is gone fails at issue time: that too is
    ``PeerLostError``."""
    try:
        return issue()
    except RuntimeError as exc:
        raise PeerLostError.from_failure(what, exc, rank=_rank(group),
                                         generation=_generation(group)) from exc


def wait_for(work: Any, group: Group, what: str,
             abandoned: Callable[[], bool] | None = None) -> Any:
    """Wait for ``work`` of ``group``; a failure, or a peer that abandoned the step (when
    ``group`` is a ``GroupHandle`` that can tell), raises ``PeerLostError``."""
    if abandoned is None and isinstance(group, GroupHandle):
        abandoned = group.step_abandoned
    done = getattr(work, "is_completed", None) or getattr(work, "done", None)
    if done is not None and not wait_unless(done, abandoned):
        raise PeerLostError.from_failure(what, "a peer abandoned the step",
                                         rank=_rank(group), generation=_generation(group))
    try:
        return work.wait()
    except RuntimeError as exc:
        raise PeerLostError.from_failure(what, exc, rank=_rank(group),
                                         generation=_generation(group)) from exc


def _generation(group: Group) -> int:
    return group.generation if isinstance(group, GroupHandle) else 0


def _rank(group: Group) -> int:
    try:
        return int(group.rank())
    except (RuntimeError, PotluckError):
        return -1


def broadcast_coalesced(tensors: Sequence[torch.Tensor], group: Group, src: int = 0) -> None:
    """Broadcast ``tensors`` from rank ``src`` in place, one flat message per dtype/device."""
    for flat, members in _flatten_groups(tensors):
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        settle(partial(group.broadcast, [flat], opts), group, "broadcast")
        _unflatten_into(flat, members)


class PendingBroadcast:
    """An in-flight coalesced broadcast; ``wait()`` copies the result into the tensors."""

    def __init__(self, tensors: Sequence[torch.Tensor], group: Group, src: int = 0) -> None:
        self._parts = _flatten_groups(tensors)
        self._group = group
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self._works = [group.broadcast([flat], opts) for flat, _ in self._parts]

    def wait(self, abandoned: Callable[[], bool] | None = None) -> None:
        for work, (flat, members) in zip(self._works, self._parts, strict=True):
            wait_for(work, self._group, "buffer broadcast", abandoned)
            _unflatten_into(flat, members)


def allgather_tensor(tensor: torch.Tensor, group: Group) -> list[torch.Tensor]:
    """Every rank's copy of ``tensor`` (same shape and dtype on every rank), in rank order."""
    outputs = [torch.empty_like(tensor) for _ in range(group.size())]
    settle(lambda: group.allgather([outputs], [tensor]), group, "all-gather")
    return outputs


def wait_unless(done: Callable[[], bool], abandoned: Callable[[], bool] | None,
                poll: float = 0.05) -> bool:
    """Wait until ``done()``; False as soon as ``abandoned()`` (asked every ``poll`` s)
    says a peer gave up, so nobody waits out a collective timeout for a peer that left
    the collective on purpose. With no ``abandoned``, returns at once (the caller's
    ``wait()`` then blocks as usual)."""
    if abandoned is None or done():
        return True
    pause, next_check = 0.0002, time.monotonic() + poll
    while not done():
        time.sleep(pause)
        pause = min(2 * pause, 0.005)
        if time.monotonic() >= next_check:
            if abandoned():
                return False
            next_check = time.monotonic() + poll
    return True


def allreduce_max(tensor: torch.Tensor, group: Group, what: str = "vote") -> torch.Tensor:
    """Element-wise maximum of ``tensor`` across ranks, in place (flags, votes); a lost
    peer (or one that abandoned the step) raises ``PeerLostError``."""
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX  # type: ignore[assignment]
    settle(lambda: group.allreduce([tensor], opts), group, what)
    return tensor


def allgather_object(obj: Any, group: Group, device: torch.device | None = None) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order, over an explicit group object.

    Unlike ``torch.distributed.all_gather_object`` this needs no registered default
    group: the pickled bytes travel as uint8 tensors (lengths first, then padded bytes).
    """
    device = device or torch.device("cpu")
    payload = pickle.dumps(obj)
    length = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    lengths = [int(t.item()) for t in allgather_tensor(length, group)]
    padded = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    padded[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    gathered = allgather_tensor(padded, group)
    return [pickle.loads(bytes(g[:n].cpu().numpy().tobytes()))
            for g, n in zip(gathered, lengths, strict=True)]


def broadcast_object(obj: Any, group: Group, src: int = 0,
                     device: torch.device | None = None,
                     timeout: timedelta | None = None) -> Any:
    """Rank ``src``'s picklable ``obj`` on every rank (others pass anything, e.g. None);
    ``src`` gets ``obj`` itself back, the others a copy whose plain tensors are on the
    CPU. The tensors travel as raw bytes beside a small pickle (``tensor_pack``), in one
    broadcast on ``device`` after one of its length.

    ``timeout`` replaces the group's own for this call (e.g. to wait for a slow joiner).
    """
    device = device or torch.device("cpu")
    packed = tensor_pack.pack(obj, device) if group.rank() == src else None
    length = torch.tensor([0 if packed is None else packed.numel()], dtype=torch.int64,
                          device=device)
    opts = dist.BroadcastOptions()
    opts.rootRank = src
    if timeout is not None:
        opts.timeout = timeout
    settle(lambda: group.broadcast([length], opts), group, "state broadcast")
    data = packed if packed is not None else torch.empty(
        int(length.item()), dtype=torch.uint8, device=device)
    settle(lambda: group.broadcast([data], opts), group, "state broadcast")
    return obj if packed is not None else tensor_pack.unpack(data)


def group_rank_and_size(group: Group | None) -> tuple[int, int]:
    """(rank, world size) in ``group``; the default group if None; (0, 1) without one."""
    group = group if group is not None else default_group()
    if group is None:
        return 0, 1
    return int(group.rank()), int(group.size())


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
