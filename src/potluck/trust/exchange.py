"""Robust aggregation inside the all-reduce's split: a communication hook.

For each gradient bucket every trusted rank owns one slice (as in a reduce-scatter):

1. an all-to-all sends each owner every rank's copy of its slice (each rank's plain
   gradient, averaged over its own samples: the reducer does not weigh it);
2. the owner aggregates its slice robustly (``aggregate.py``) with the ranks' weights
   from the step's split (``samples()``: the share planner's, never the ranks' word);
3. a second all-to-all hands every rank every owner's aggregate (an all-gather).

Backward is not held up by a bucket's round trip: the hook's call for a bucket launches
step 1 and returns, and steps 2 and 3 run in its call for the next bucket, once that
bucket's gradients are computed (the last bucket's in its own call). So the copies
travel while backward goes on, as a plain all-reduce does, and every rank issues the
collectives in one order: a bucket's second all-to-all before the next one's first.

Per rank that is ``2 (N - 1) / N`` of the bucket, the bytes of a ring all-reduce. What
trust needs to judge the step rides on the same two all-to-alls (``wire.py``), and
so does the reducer's unused-parameter bitmap: a clean step has no other collective
(and there is no finiteness vote):

- each copy carries its sender's fingerprint (of the parameters the gradient was
  computed on, taken at the step's first bucket), and in the pass's last bucket the
  sender's unused-parameter bitmap (``reducer.hooks.BitmapCarrier``: which parameters
  it produced a gradient for);
- each aggregate carries its owner's report (``wire.encode_report``): per sender,
  whether its copies were finite and whether one was a replay (``replay.py``), their
  squared distance to the aggregate, the
  fingerprint received and the digests of the aggregates and reports it handed this
  owner in the last step (``report_handed``, with their key); the owner's spot check
  and audit result of the last step (``report_spot``, ``report_audit``); as the
  audited owner, the digests of the copies it received; then, in the last bucket, the
  bitmap: the bytes' OR over its senders' (every rank then takes the OR over the
  owners', so an owner can add a parameter, a zero gradient where it would have been
  None, but not drop one an honest rank used; a quarantined member's bytes do not
  count: a parameter only it used has no gradient on the trusted ranks);
- the **audit** (``audit.py``): after a step, ``TrustPart`` may pick one owner (from a
  hash of the reports, so after the fact) and ``plan_audit`` it; in the next step
  every rank's copy of that owner's slices rides along with its aggregate, tagged
  with the owner and step it believes were picked (``wire.audit_tag``), so every rank
  holds all of them.

With a codec (``prepare(trust=..., comm_hook=CompressedSum(codec))``) the first
all-to-all carries each copy encoded, with its sender's error feedback, and the owner
aggregates the decoded copies (``lanes.py``); the aggregates travel as they are.
``traffic`` counts the bytes this rank puts on the wire in both.

A quarantined member of a fixed cohort still takes part but owns no slice and sends
nothing that counts. What this rank received goes into a ``Ledger``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from potluck.collectives import wait_for
from potluck.compress.exchange import Traffic
from potluck.errors import PotluckError
from potluck.reducer.hook_failure import hook_error, is_backend_failure
from potluck.reducer.hooks import Bucket
from potluck.trust import wire
from potluck.trust.aggregate import Aggregator, aggregate_measured
from potluck.trust.lanes import PLAIN, Lanes, laid_out
from potluck.trust.replay import ReplayWatch
from potluck.trust.verdict import AuditResult, Handed, SpotResult

if TYPE_CHECKING:
    from potluck.trust.audit import AuditPlan


def assigned(split: Sequence[float] | None, ranks: Iterable[int]) -> list[float]:
    """Each rank's assigned part of the step (``split``: the loader's samples, or the
    units ``weight=`` reads from each rank's batch; 1 each where it is unknown): the
    weight its copy gets, never a number it claimed."""
    return [float(split[r]) if split is not None and r < len(split) else 1.0 for r in ranks]


@dataclass
class Kept:
    """One bucket of the step as this rank saw it. ``mine`` is its copy, ``[owners,
    piece]`` (owner k's slice in row k, zeros past the bucket's end; rows of the send
    buffer, so maybe strided; with a codec each row is the encoded copy, as ``lanes``
    sent it); ``received`` holds, per
    owner, ``stride`` values: its aggregate (``piece``), its report (``report`` values),
    its bitmap (``bits`` values; none but in the pass's last bucket) and the audit copy
    it sent with its tag (the rest: a copy as ``mine`` holds it and one word, or
    nothing). As an owner, ``copies`` are the senders' copies of its slice as they
    travelled (``[senders, piece]``, or encoded; empty otherwise)."""

    mine: torch.Tensor
    received: torch.Tensor
    piece: int
    report: int
    owners: tuple[int, ...]
    senders: tuple[int, ...]
    weights: torch.Tensor
    copies: torch.Tensor
    parameters: tuple[torch.nn.Parameter, ...]
    bits: int = 0
    lanes: Lanes = PLAIN
    stride: int = field(init=False)
    _rows: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.stride = self.received.numel() // max(1, len(self.owners))
        self._rows = self.received.view(len(self.owners), self.stride)  # (read every step)

    def rows(self) -> torch.Tensor:
        return self._rows

    def row_of(self, owner: int) -> torch.Tensor:
        """Everything ``owner`` handed this rank: its aggregate, report, any bitmap,
        and any audit copy and tag it carried."""
        return self._rows[self.owners.index(owner)]

    def aggregate_of(self, owner: int) -> torch.Tensor:
        return self.rows()[self.owners.index(owner), :self.piece]

    def copy_of(self, owner: int) -> torch.Tensor:
        """This rank's copy of ``owner``'s slice (as it was sent)."""
        return self.mine[self.owners.index(owner)]

    def report_of(self, owner: int) -> torch.Tensor:
        """``owner``'s report words, as values."""
        return self.rows()[self.owners.index(owner), self.piece:self.piece + self.report]

    def reports(self) -> torch.Tensor:
        """``[owners, report words]``."""
        block = self.rows()[:, self.piece:self.piece + self.report]
        return wire.to_words(block).view(len(self.owners), -1)

    def audit_copies(self) -> torch.Tensor:
        """``[owners, values]``: each owner's copy of the audited slice (as it was sent:
        ``lanes.copies`` decodes them)."""
        block = self.rows()[:, self.piece + self.report + self.bits:]
        return block[:, :max(0, block.shape[1] - wire.per_word(block.dtype))]

    def audit_tags(self) -> list[int]:
        """Each owner's tag on its audit copy (``wire.audit_tag``); empty: none carried."""
        block = self.rows()[:, self.piece + self.report + self.bits:]
        if block.shape[1] == 0:
            return []
        word = wire.per_word(block.dtype)
        return wire.to_words(block[:, -word:]).tolist()


@dataclass
class Ledger:
    """What this rank saw in the step's buckets (reset by the first bucket)."""

    world_size: int = 0
    buckets: dict[int, Kept] = field(default_factory=dict)
    audit: AuditPlan | None = None  # the plan this step carried the copies for

    def reset(self, world_size: int, audit: AuditPlan | None = None) -> None:
        self.world_size, self.buckets, self.audit = world_size, {}, audit


class RobustExchange:
    """The hook (``DataParallel(comm_hook=...)``; ``state`` is unused). ``fingerprint()``
    is called at each step's first bucket (0: not compared this step). ``lanes``: how
    the copies travel (``lanes.Coded``: through a codec)."""

    prescaled = False  # each rank's plain gradient: the owner weighs the copies
    carries_bitmap = True  # the unused-parameter bitmap rides on the two all-to-alls

    def __init__(self, aggregator: Aggregator, ledger: Ledger,
                 samples: Callable[[], Sequence[float] | None],
                 trusted: Callable[[int], Sequence[int]],
                 fingerprint: Callable[[], int], lanes: Lanes = PLAIN) -> None:
        self.aggregator, self.ledger, self.lanes = aggregator, ledger, lanes
        self.traffic = Traffic()  # bytes this rank sent to others, in both all-to-alls
        self._samples, self._trusted, self._fingerprint = samples, trusted, fingerprint
        self._plan: AuditPlan | None = None
        self._next = _Said()  # what the next step's reports say of this one
        self._said = _Said()  # what this step's reports say (of the last one)
        self._replays = ReplayWatch()  # (as an owner: each sender's last copies' sums)
        self._print = 0
        self._scratch = Scratch()
        self._weighed: tuple[tuple[tuple[float, ...], torch.device], torch.Tensor] | None = None
        self._scattered: _Scattered | None = None  # a bucket awaiting its aggregation

    def plan_audit(self, plan: AuditPlan | None) -> None:
        """Carry every rank's copy of ``plan.owner``'s slices in the next step (and, as
        the audited owner, report the digests of the copies it received)."""
        self._plan = plan

    def report_spot(self, result: SpotResult | None) -> None:
        """This owner's spot check of the last step, for the next step's reports."""
        self._next = replace(self._next, spot=result)

    def report_audit(self, result: AuditResult | None) -> None:
        """This owner's audit of the copies the last step carried, for the next step's
        reports."""
        self._next = replace(self._next, audit=result)

    def report_handed(self, handed: Handed) -> None:
        """The digests of what each owner handed this rank in the last step
        (``TrustPart``), for the next step's reports."""
        self._next = replace(self._next, handed=handed)

    def forget(self) -> None:
        """Nothing planned or found so far rides in the next step: a new generation
        renumbered the ranks, or a step had no synced backward to judge."""
        self._plan, self._next = None, _Said()
        self.lanes.rollback()
        self._drop_scattered("the exchange was reset (a new generation, or no synced pass)")
        self._replays.forget()
        self._scratch.clear()

    def committed(self) -> None:
        """The last pass's step committed (its sends count: a codec's error feedback
        keeps what they left out)."""
        self.lanes.commit()

    def __call__(self, state: Any, bucket: Bucket) -> torch.futures.Future[torch.Tensor]:
        """Launches ``bucket``'s first all-to-all. The rest of a bucket (waiting for its
        copies, the aggregation, the second all-to-all) runs in the call for the next
        bucket, so backward computes that one's gradients meanwhile; the pass's last
        bucket finishes in its own call. Every rank issues the collectives in one order:
        each bucket's second all-to-all before the next bucket's first."""
        if bucket.index == 0:
            self._drop_scattered("a new pass began before its aggregation")
            self.ledger.reset(bucket.world_size, self._plan)
            self.lanes.begin()
            self._plan, self._print = None, self._fingerprint()
            self._said, self._next = self._next, _Said()
        else:
            scattered, self._scattered = self._scattered, None
            if scattered is not None:
                self._finish(scattered, bucket.index)
        scattered = self._scatter(bucket)
        if bucket.index < bucket.count - 1:
            self._scattered = scattered
            return scattered.result
        return self._gathered(scattered)

    def _finish(self, scattered: _Scattered, now: int) -> None:
        """The earlier bucket ``scattered``, in the call for bucket ``now``. Its future
        fails if this does (nothing waits on it forever), and an error of its own code
        names that bucket, not the one whose call it ran in (the reducer names that one)."""
        try:
            _settle(self._gathered(scattered), scattered.result)
        except BaseException as exc:
            failure = exc if isinstance(exc, Exception) else RuntimeError(
                f"trust's exchange was interrupted by {type(exc).__name__}")
            scattered.result.set_exception(failure)  # type: ignore[arg-type]
            if (not isinstance(exc, Exception) or isinstance(exc, PotluckError)
                    or is_backend_failure(exc)):
                raise  # (a lost peer, a refused input, Ctrl-C: as they are)
            raise hook_error(type(self).__qualname__, f"bucket {scattered.bucket.index}'s "
                             f"aggregation (run in bucket {now}'s call)", exc,
                             scattered.bucket.rank) from exc

    def _scatter(self, bucket: Bucket) -> _Scattered:
        """1. Each owner gets every sender's copy of its slice, the sender's fingerprint
        and (the last bucket) its bitmap: this rank's copy is laid out in its lanes to
        the owners, one per owner (the only copy of the gradient made here)."""
        group, n, me = bucket.group, bucket.world_size, bucket.rank
        flat = bucket.buffer.view(-1)
        dtype, word = flat.dtype, wire.per_word(flat.dtype)
        owners = tuple(sorted(self._trusted(n)))
        senders = owners  # the copies that count come from the trusted ranks
        weights = self._weights(assigned(self._samples(), senders), flat.device)
        piece = max(1, math.ceil(flat.numel() / len(owners)))
        take = self._scratch.taker(bucket.index, dtype, flat.device)
        owner, sending = me in owners, me in senders
        produced = bucket.produced
        marks = 0 if produced is None else wire.words_for(produced.numel())
        width = self.lanes.width(piece, dtype)  # (piece, without a codec)
        lane = width + (1 + marks) * word
        if sending:
            send = take("send", len(owners) * lane)
            lanes = send.view(len(owners), lane)
            mine = self.lanes.lay_out(bucket.index, flat, lanes[:, :width], piece, take)
            lanes[:, width:] = wire.to_values(_header(self._print, produced, marks),
                                              dtype).to(flat.device)
        else:
            send = torch.empty(0, dtype=dtype, device=flat.device)
            mine = self.lanes.idle(flat, take("mine", width * len(owners)).view(len(owners),
                                                                               width))
        to_each = [lane if sending and r in owners else 0 for r in range(n)]
        from_each = [lane if owner and r in senders else 0 for r in range(n)]
        self.traffic.sent += (sum(to_each) - to_each[me]) * flat.element_size()
        self.traffic.exchanges += 1
        received = take("received", sum(from_each))
        work = group.alltoall_base(received, send, from_each, to_each)  # type: ignore[attr-defined]
        # (a future of the bucket's device, so that waiting for it syncs the streams the
        # aggregates were copied on, as the chained future it is completed with does)
        devices: list[int | str | torch.device] | None = (
            None if flat.device.type == "cpu" else [flat.device])
        return _Scattered(bucket, work, received, mine, owners, weights, piece, width, lane,
                          marks, take, torch.futures.Future(devices=devices))

    def _gathered(self, scattered: _Scattered) -> torch.futures.Future[torch.Tensor]:
        """2. Once the copies are in: every rank gets every owner's aggregate, its
        report, its bitmap and any audit copy (the second all-to-all, launched here);
        the bucket's reduced gradient when it is done."""
        s = scattered
        bucket, owners, piece, width, buffer = s.bucket, s.owners, s.piece, s.width, s.take
        senders = owners  # (as in _scatter: the trusted ranks)
        group, n, me = bucket.group, bucket.world_size, bucket.rank
        flat = bucket.buffer.view(-1)
        dtype, word = flat.dtype, wire.per_word(flat.dtype)
        owner, produced, marks = me in owners, bucket.produced, s.marks
        wait_for(s.work, group, "robust aggregation (scatter)")
        audited = self._audited(bucket.index, owners, flat)
        report, bits = wire.report_words(len(senders)) * word, marks * word
        stride = piece + report + bits + audited.numel()
        if owner:
            rows = s.received.view(len(senders), s.lane)
            copies = self.lanes.copies(rows[:, :width], piece)  # (decoded, with a codec)
            value, d2, finite = aggregate_measured(self.aggregator, copies, s.weights)
            headers = wire.to_words(rows[:, width:]).view(len(senders), 1 + marks).tolist()
            prints = [h[0] for h in headers]
            audit = self.ledger.audit
            digests = (audit.received_digests(senders) if audit is not None and audit.owner == me
                       else None)
            words = wire.encode_report(
                piece, finite, d2,
                prints, self._said.spot, self._said.audit, digests, self._said.handed,
                senders, self._replays.check(bucket.index, senders, rows[:, :width],
                                             s.weights))
            outgoing = buffer("outgoing", n * stride)
            handed = outgoing.view(n, stride)  # the same row for every rank
            handed[0, :piece] = value
            handed[0, piece:piece + report] = wire.to_values(words, dtype).to(flat.device)
            if marks:
                handed[0, piece + report:piece + report + bits] = wire.to_values(
                    _merged(h[1:] for h in headers), dtype).to(flat.device)
            handed[0, piece + report + bits:] = audited
            handed[1:] = handed[0]
        else:
            rows = s.received.view(0, s.lane)
            outgoing = torch.empty(0, dtype=dtype, device=flat.device)
        self.traffic.sent += outgoing.numel() // n * (n - 1) * flat.element_size()
        result = buffer("result", stride * len(owners))
        work = group.alltoall_base(  # type: ignore[attr-defined]
            result, outgoing, [stride if r in owners else 0 for r in range(n)],
            [stride if owner else 0] * n)
        self.ledger.buckets[bucket.index] = Kept(s.mine, result, piece, report, owners,
                                                 senders, s.weights, rows[:, :width],
                                                 bucket.parameters, bits, self.lanes)
        numel = flat.numel()

        def done(fut: torch.futures.Future[Any]) -> torch.Tensor:
            fut.value()  # re-raises the collective's failure
            # Not into the bucket: the reducer copies the result there once it settles the
            # step, and not at all for a step it gave up (a late callback of an abandoned
            # step must not write into the buffers of the step that redoes it).
            into, aggregates = buffer("out", numel), result.view(len(owners), stride)
            for i in range(len(owners)):  # each owner's aggregate, in the slices' order
                start = i * piece
                end = min(numel, start + piece)
                if start < end:
                    into[start:end] = aggregates[i, :end - start]
            if produced is not None:  # the owners' bitmaps, OR-ed: the pass's
                marked = wire.to_words(aggregates[:, piece + report:piece + report + bits])
                agreed = _merged(marked.view(len(owners), marks).tolist())
                produced.copy_(agreed.view(torch.uint8)[:produced.numel()])
            return into.view_as(bucket.buffer)

        return work.get_future().then(done)  # type: ignore[no-any-return]

    def _drop_scattered(self, why: str) -> None:
        """A bucket whose aggregation never came (its pass failed before the next
        bucket): its future fails, and nothing of it is carried on."""
        scattered, self._scattered = self._scattered, None
        if scattered is not None and not scattered.result.done():
            scattered.result.set_exception(RuntimeError(f"trust's exchange: {why}"))  # type: ignore[arg-type]

    def _weights(self, parts: list[float], device: torch.device) -> torch.Tensor:
        """The senders' weights as a tensor, made again only when they change (never
        written to: the kept buckets and audit plans share it)."""
        key = (tuple(parts), device)
        if self._weighed is None or self._weighed[0] != key:
            self._weighed = key, torch.tensor(parts, dtype=torch.float32, device=device)
        return self._weighed[1]

    def _audited(self, index: int, owners: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """This rank's copy of the audited owner's slice in bucket ``index`` of the
        planned step (empty when nothing is audited or the buckets changed since)."""
        plan = self.ledger.audit
        audited = plan.buckets.get(index) if plan is not None else None
        if (plan is None or audited is None or audited.owners != owners  # alike on all ranks
                or audited.copy.dtype != like.dtype or audited.copy.device != like.device):
            return like.new_empty(0)  # (the first pass's rebuild may change a bucket's dtype)
        tag = torch.tensor([wire.audit_tag(plan.owner, plan.step)], dtype=torch.int64)
        return torch.cat([audited.copy, wire.to_values(tag, like.dtype).to(like.device)])


_laid_out = laid_out  # (where the wire's unit tests find it)


def _header(fingerprint: int, produced: torch.Tensor | None, marks: int) -> torch.Tensor:
    """A sender's words after its slice: its fingerprint, then ``marks`` words of its
    unused-parameter bitmap (``Bucket.produced``) when the bucket carries it."""
    header = torch.zeros(1 + marks, dtype=torch.int64)
    header[0] = fingerprint
    if produced is not None:
        header.view(torch.uint8)[wire.WORD:wire.WORD + produced.numel()] = produced
    return header


def _merged(rows: Iterable[Sequence[int]]) -> torch.Tensor:
    """Bitmap words OR-ed position by position (``wire.either``), as int64 words."""
    return torch.tensor(wire.either(rows), dtype=torch.int64)


class Scratch:
    """The hook's buffers, one set per bucket, kept from step to step on the CPU. A step
    reads what it wrote in them until the next step's same bucket (the ledger is reset
    at the first bucket), so one set suffices. Allocated afresh every step (then six
    buffers, six to eight gradients' worth with an audit copy riding along), glibc gave
    them back to the system after each step and faulted them in again page by page:
    about 4,500 page faults a rank and step for a 1.1M-parameter model. A buffer is
    kept at the largest size asked for and sliced (an audited step's rows are about
    twice an unaudited one's). On an accelerator they are allocated per step (its
    caching allocator reuses them, and between steps that memory serves the forward
    and backward)."""

    def __init__(self) -> None:
        self._kept: dict[tuple[int, str], torch.Tensor] = {}

    def taker(self, bucket: int, dtype: torch.dtype,
              device: torch.device) -> Callable[[str, int], torch.Tensor]:
        """``(name, numel) -> tensor``: bucket ``bucket``'s buffer ``name`` (its values
        are whatever was in it: write before reading)."""
        def take(name: str, numel: int) -> torch.Tensor:
            if device.type != "cpu":
                return torch.empty(numel, dtype=dtype, device=device)
            kept = self._kept.get((bucket, name))
            if kept is None or kept.numel() < numel or kept.dtype != dtype:
                kept = self._kept[(bucket, name)] = torch.empty(numel, dtype=dtype)
            return kept[:numel]
        return take

    def clear(self) -> None:
        self._kept.clear()


@dataclass(frozen=True)
class _Said:
    """What an owner's reports in a step say of the step before: its spot check, its
    audit of the carried copies, and the digests of what each owner handed it (its
    whole row, and its report words)."""

    spot: SpotResult | None = None
    audit: AuditResult | None = None
    handed: Handed | None = None


@dataclass(frozen=True)
class _Scattered:
    """A bucket whose copies are on their way to the owners (its first all-to-all,
    ``work``, into ``received``; the work holds its tensors), with what its aggregation
    needs (the senders are the owners; a copy is ``width`` values in a ``lane``);
    ``result`` is the future the reducer was handed for it."""

    bucket: Bucket
    work: Any
    received: torch.Tensor
    mine: torch.Tensor
    owners: tuple[int, ...]
    weights: torch.Tensor
    piece: int
    width: int
    lane: int
    marks: int
    take: Callable[[str, int], torch.Tensor]
    result: torch.futures.Future[torch.Tensor]


def _settle(source: torch.futures.Future[torch.Tensor],
            target: torch.futures.Future[torch.Tensor]) -> None:
    """``target`` completes as ``source`` does, with its value or its failure."""
    def forward(fut: torch.futures.Future[torch.Tensor]) -> None:
        try:
            value = fut.value()
        except Exception as exc:  # (the collective's failure, for the reducer)
            target.set_exception(exc)  # type: ignore[arg-type]
        else:
            target.set_result(value)
    source.add_done_callback(forward)
