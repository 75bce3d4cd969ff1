"""Robust aggregation inside the all-reduce's split: a communication hook.

For each gradient bucket every trusted rank owns one slice (as in a reduce-scatter):

1. an all-to-all sends each owner every rank's copy of its slice (each rank's plain
   gradient, averaged over its own samples: the reducer does not weigh it);
2. the owner aggregates its slice robustly (``aggregate.py``) with the ranks' weights
   from the step's split (``samples()``: the share planner's, never the ranks' word),
   and notes each sender's distance to the aggregate and whether its copy was finite;
3. a second all-to-all hands every rank every owner's aggregate (an all-gather).

Per rank that is ``2 (N - 1) / N`` of the bucket, the bytes of a ring all-reduce. A
quarantined member of a fixed cohort still takes part but owns no slice and sends
nothing that counts. What this rank needs to judge the step later (the reports, its
own copy and the aggregates, for the audit) goes into a ``Ledger``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from potluck.collectives import wait_for
from potluck.reducer.hooks import Bucket
from potluck.trust.aggregate import Aggregator, distances


@dataclass
class Kept:
    """One bucket of the step: this rank's copy and the aggregates, padded to
    ``piece * len(owners)`` values (owner o's slice at ``o * piece``)."""

    mine: torch.Tensor
    result: torch.Tensor
    piece: int
    owners: tuple[int, ...]
    senders: tuple[int, ...]
    weights: torch.Tensor


@dataclass
class Ledger:
    """What this rank saw in the step's buckets (reset by the first bucket)."""

    world_size: int = 0
    finite: list[float] = field(default_factory=list)  # per sender, as this rank's owner
    distance: list[float] = field(default_factory=list)  # per sender
    owned: int = 0  # values this rank aggregated
    buckets: dict[int, Kept] = field(default_factory=dict)

    def reset(self, world_size: int) -> None:
        self.world_size, self.owned = world_size, 0
        self.finite, self.distance = [1.0] * world_size, [0.0] * world_size
        self.buckets = {}


class RobustExchange:
    """The hook (``DataParallel(comm_hook=...)``; ``state`` is unused)."""

    prescaled = False  # each rank's plain gradient: the owner weighs the copies

    def __init__(self, aggregator: Aggregator, ledger: Ledger,
                 samples: Callable[[], Sequence[int] | None],
                 trusted: Callable[[int], Sequence[int]]) -> None:
        self.aggregator, self.ledger = aggregator, ledger
        self._samples, self._trusted = samples, trusted

    def __call__(self, state: Any, bucket: Bucket) -> torch.futures.Future[torch.Tensor]:
        group, n, me = bucket.group, bucket.world_size, bucket.rank
        if bucket.index == 0:
            self.ledger.reset(n)
        flat = bucket.buffer.view(-1)
        owners = tuple(sorted(self._trusted(n)))
        senders = owners  # the copies that count come from the trusted ranks
        split = self._samples()
        counts = [float(split[r]) if split is not None and r < len(split) else 1.0
                  for r in senders]
        weights = torch.tensor(counts, dtype=torch.float32, device=flat.device)
        piece = max(1, math.ceil(flat.numel() / len(owners)))
        mine = torch.zeros(piece * len(owners), dtype=flat.dtype, device=flat.device)
        mine[:flat.numel()] = flat
        owner = me in owners
        to_each = [piece if r in owners else 0 for r in range(n)]
        from_each = [piece if owner and r in senders else 0 for r in range(n)]
        received = torch.empty(sum(from_each), dtype=flat.dtype, device=flat.device)
        send = mine if me in senders else torch.empty(0, dtype=flat.dtype, device=flat.device)
        if me not in senders:
            to_each = [0] * n
        work = group.alltoall_base(received, send, from_each, to_each)  # type: ignore[attr-defined]
        wait_for(work, group, "robust aggregation (scatter)")
        if owner:
            copies = received.view(len(senders), piece).float()
            value = self.aggregator.aggregate(copies, weights)
            self._note(senders, copies, value)
            outgoing = value.to(flat.dtype).repeat(n)
        else:
            outgoing = torch.empty(0, dtype=flat.dtype, device=flat.device)
        result = torch.empty(piece * len(owners), dtype=flat.dtype, device=flat.device)
        work = group.alltoall_base(  # type: ignore[attr-defined]
            result, outgoing, [piece if r in owners else 0 for r in range(n)],
            [piece if owner else 0] * n)
        self.ledger.buckets[bucket.index] = Kept(mine, result, piece, owners, senders, weights)
        numel = flat.numel()

        def done(fut: torch.futures.Future[Any]) -> torch.Tensor:
            fut.value()  # re-raises the collective's failure
            return result[:numel].view_as(bucket.buffer)

        return work.get_future().then(done)  # type: ignore[no-any-return]

    def _note(self, senders: Sequence[int], copies: torch.Tensor, value: torch.Tensor) -> None:
        ledger = self.ledger
        d2 = distances(copies, value).tolist()
        finite = torch.isfinite(copies).all(dim=1).tolist()
        ledger.owned += int(copies.shape[1])
        for row, sender in enumerate(senders):
            ledger.distance[sender] += d2[row]
            if not finite[row]:
                ledger.finite[sender] = 0.0


def recompute(kept: Sequence[Kept], owner: int, gathered: Sequence[Sequence[torch.Tensor]],
              aggregator: Aggregator) -> float:
    """The audit of ``owner``'s slices: the largest difference, relative to the slice's
    size, between what it handed out and the aggregate of every rank's copy
    (``gathered[b][i]``: sender i's copy of the slice in bucket b)."""
    worst = 0.0
    for bucket, copies in zip(kept, gathered, strict=True):
        where = bucket.owners.index(owner) * bucket.piece
        given = bucket.result[where:where + bucket.piece].float()
        expected = aggregator.aggregate(torch.stack(list(copies)).float(), bucket.weights)
        expected = expected.to(bucket.result.dtype).float()  # rounded as the owner's was
        diff = (given - expected).abs()
        diff = torch.where(torch.isnan(given) & torch.isnan(expected),
                           torch.zeros_like(diff), diff)
        diff = torch.nan_to_num(diff, nan=math.inf)
        scale = 1.0 + float(torch.nan_to_num(expected, nan=0.0, posinf=0.0,
                                             neginf=0.0).abs().max())
        worst = max(worst, float(diff.max()) / scale)
    return worst
