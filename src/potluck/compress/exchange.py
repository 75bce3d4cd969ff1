"""The sum of a flat tensor across the ranks of a group, encoded by a codec on the wire.

Which collectives carry it (``route``, pure) follows from the codec's flags:

- ``allreduce``: a summable payload (a cast) is all-reduced in its own dtype;
- ``allgather``: every rank's payload goes to every rank, which decodes all of them and
  adds them up in rank order (so every rank holds the same sum, bitwise). Sparse codecs
  always, dense ones with 2 ranks (the same bytes as a scatter, one round trip fewer,
  and nothing is encoded twice);
- ``scatter``: dense codecs with more than 2 ranks. The tensor is cut into one slice per
  rank; an all-to-all sends each slice's payload to the rank that owns it, which sums
  them, encodes the sum and all-gathers it. Per rank that is ``2 (N - 1) / N`` payloads,
  the bytes of a ring all-reduce, whatever N.

With ``feedback`` every encoding is error-fed back (``feedback.py``): this rank's
payload under ``key``, and an owner's encoded slice sum under ``key + "/sum"``.
``Traffic`` counts the payload bytes this rank puts on the wire.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from potluck.collectives import wait_for
from potluck.compress.codec import Codec
from potluck.compress.feedback import ErrorFeedback
from potluck.errors import PeerLostError
from potluck.group import ProcessGroupLike


@dataclass
class Traffic:
    """Payload bytes this rank sent (what a link's counters would show, less headers)."""

    sent: int = 0
    exchanges: int = 0


def route(codec: Codec, world_size: int) -> str:
    """``allreduce``, ``allgather`` or ``scatter`` (see the module doc)."""
    if codec.summable:
        return "allreduce"
    if not codec.dense or world_size <= 2:
        return "allgather"
    return "scatter"


def sent_bytes(codec: Codec, numel: int, world_size: int) -> int:
    """Payload bytes one rank sends to sum ``numel`` values over ``world_size`` ranks."""
    n = world_size
    if n <= 1:
        return 0
    if route(codec, n) == "allgather":
        return (n - 1) * codec.nbytes(numel)
    # a ring all-reduce, or a scatter: N - 1 slices out, then N - 1 slices back
    return 2 * (n - 1) * codec.nbytes(math.ceil(numel / n))


def _encoded(codec: Codec, flat: torch.Tensor, feedback: ErrorFeedback | None,
             key: str) -> torch.Tensor:
    if feedback is None:
        return codec.encode(flat)
    sent = feedback.compensate(key, flat)
    payload = codec.encode(sent)
    feedback.remember(key, sent, codec.decode(payload, sent.numel(), sent.dtype))
    return payload


def start_sum(flat: torch.Tensor, codec: Codec, group: ProcessGroupLike, *,
              feedback: ErrorFeedback | None = None, key: str = "flat",
              traffic: Traffic | None = None) -> torch.futures.Future[torch.Tensor]:
    """Issue the sum of ``flat`` (1-d, floating point) across ``group``; the future's
    value is a new tensor of ``flat``'s dtype. A scatter waits for its first phase here."""
    numel, dtype, n = flat.numel(), flat.dtype, int(group.size())
    if traffic is not None:
        traffic.sent += sent_bytes(codec, numel, n)
        traffic.exchanges += 1
    way = route(codec, n)
    if way == "allreduce":
        payload = _encoded(codec, flat, feedback, key)
        future = group.allreduce([payload]).get_future()
        return _then(future, lambda: codec.decode(payload, numel, dtype))
    if way == "allgather":
        payload = _encoded(codec, flat, feedback, key)
        return _gather(codec, payload, group, numel, dtype)
    return _scatter(flat, codec, group, feedback, key)


def reduce_sum(flat: torch.Tensor, codec: Codec, group: ProcessGroupLike, *,
               feedback: ErrorFeedback | None = None, key: str = "flat",
               traffic: Traffic | None = None, what: str = "compressed sum") -> torch.Tensor:
    """``start_sum`` and wait; a lost peer is ``PeerLostError``."""
    try:
        future = start_sum(flat, codec, group, feedback=feedback, key=key, traffic=traffic)
    except RuntimeError as exc:  # a backend that already knows a peer is gone
        raise PeerLostError.from_failure(what, exc, rank=int(group.rank()),
                                         generation=getattr(group, "generation", 0)) from exc
    return wait_for(future, group, what)  # type: ignore[no-any-return]


def _then(future: torch.futures.Future[Any],
          result: Callable[[], torch.Tensor]) -> torch.futures.Future[torch.Tensor]:
    def done(fut: torch.futures.Future[Any]) -> torch.Tensor:
        fut.value()  # re-raises the collective's failure
        return result()

    return future.then(done)


def _gather(codec: Codec, payload: torch.Tensor, group: ProcessGroupLike, numel: int,
            dtype: torch.dtype) -> torch.futures.Future[torch.Tensor]:
    outputs = [torch.empty_like(payload) for _ in range(int(group.size()))]
    future = group.allgather([outputs], [payload]).get_future()

    def total() -> torch.Tensor:
        acc = torch.zeros(numel, dtype=dtype, device=payload.device)
        for each in outputs:  # rank order: the same sum, bitwise, on every rank
            acc += codec.decode(each, numel, dtype)
        return acc

    return _then(future, total)


def _scatter(flat: torch.Tensor, codec: Codec, group: ProcessGroupLike,
             feedback: ErrorFeedback | None, key: str) -> torch.futures.Future[torch.Tensor]:
    n, numel, dtype = int(group.size()), flat.numel(), flat.dtype
    piece = math.ceil(numel / n)
    padded = torch.zeros(piece * n, dtype=dtype, device=flat.device)
    padded[:numel] = flat
    slices = [_encoded(codec, padded[i * piece:(i + 1) * piece], feedback, f"{key}/{i}")
              for i in range(n)]
    size = slices[0].numel()  # every slice has piece values: payloads of one size
    received = torch.empty(size * n, dtype=slices[0].dtype, device=flat.device)
    work = group.alltoall_base(  # type: ignore[attr-defined]
        received, torch.cat(slices), [size] * n, [size] * n)
    wait_for(work, group, "compressed sum (scatter)")
    mine = torch.zeros(piece, dtype=dtype, device=flat.device)
    for i in range(n):  # rank order, as everywhere
        mine += codec.decode(received[i * size:(i + 1) * size], piece, dtype)
    summed = _encoded(codec, mine, feedback, f"{key}/sum")
    outputs = [torch.empty_like(summed) for _ in range(n)]
    future = group.allgather([outputs], [summed]).get_future()
    # The owner too takes its slice from its payload: every rank ends bitwise equal.
    return _then(future, lambda: torch.cat(
        [codec.decode(each, piece, dtype) for each in outputs])[:numel])
