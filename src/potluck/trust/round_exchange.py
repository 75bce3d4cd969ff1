"""``RobustRoundSum``: a round's pseudo-gradients aggregated robustly (a ``RoundSum``).

``DiLoCoSync`` hands it each piece of this member's pseudo-gradient (``Piece``: one
fragment's tensors of one device and dtype). For each piece, as trust's every-step
exchange does for a bucket:

1. the piece is cut into one slice per trusted member (its owner). A first all-to-all
   sends each owner every trusted member's copy of its slice (through the round's
   codec, each sender keeping its own error feedback: ``lanes.py``);
2. each owner aggregates the decoded copies (``Trust.aggregator``, CenteredClip by
   default), weighted by the samples the round assigned to each member (the round's
   parts, which every member holds and which must tile the round's block), never by a
   number a member claims; and reports on every copy (``round_rules.slice_report``);
3. a second all-to-all hands every member each owner's aggregate and report, so every
   member ends with the same combined pseudo-gradient and the same reports. Where the
   work check wants some members' whole copies this round (``wanted``), each owner
   adds their slices to what it hands out as they reached it, still encoded; every
   member decodes them as the owner did (decoding is deterministic). The check needs
   no collective of its own for them, and they cost what the first all-to-all does.

A quarantined member sends nothing and owns nothing: its copy has weight 0. Bytes per
round: the two all-to-alls move what a ring all-reduce moves (each member sends
``(N - 1) / N`` of its encoded copy, each owner its aggregate to ``N - 1`` members),
plus each owner's report, ``8 * s * (4 + s)`` bytes a piece for ``s`` members, plus
``(s - 1) * T / s`` of an encoded copy for each of ``T`` wanted members.

The reports of a round are summed over its pieces and kept (``take``) for the trust
part, which judges them once the round committed (``round_part.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.futures import Future

from potluck.collectives import wait_for
from potluck.compress import Traffic
from potluck.compress.codec import Codec
from potluck.errors import QuarantinedError
from potluck.group import ProcessGroupLike
from potluck.sync.round_sum import Piece
from potluck.trust import wire
from potluck.trust.aggregate import Aggregator
from potluck.trust.lanes import lanes_for
from potluck.trust.round_rules import FIELDS, FINITE, slice_report

# (piece, its owners, the wanted members, their whole copies of it, decoded, in order)
Keeper = Callable[[Piece, tuple[int, ...], tuple[int, ...], Sequence[torch.Tensor]], None]
# (piece, its owners) -> the members whose whole copies every member gets this round
Wanted = Callable[[Piece, tuple[int, ...]], tuple[int, ...]]


@dataclass
class RoundReports:
    """A round's reports, summed over its pieces: ``reports`` ``[owners, senders,
    FIELDS + senders]``; ``senders`` their ranks; ``shares`` their assigned parts."""

    round: int
    senders: tuple[int, ...]
    shares: list[float]
    reports: torch.Tensor


class RobustRoundSum:
    """Register with ``DiLoCoSync.register_round_sum``; ``take()`` the last round's
    reports after its commit."""

    def __init__(self, aggregator: Aggregator, trusted: Callable[[int], list[int]],
                 member: Callable[[int], str], codec: Codec | None = None,
                 error_feedback: bool = True,
                 assigned: Callable[[], Sequence[float] | None] | None = None,
                 traffic: Traffic | None = None, keeper: Keeper | None = None,
                 wanted: Wanted | None = None) -> None:
        """``trusted(world_size)``: the ranks whose copies count; ``member(rank)``: its
        id (replays are compared per member); ``assigned()``: the members' parts of the
        round as the loader split it, for a piece sent mid-round (Streaming DiLoCo's
        earlier fragments), whose ``Piece.shares`` is empty; ``traffic``: where the bytes
        sent are counted (the strategy's, so its round records count them); ``keeper``:
        handed each piece with the wanted members' whole copies of it (the work
        check's, ``round_check.py``); ``wanted``: whose copies the keeper gets. Each
        slice of a wanted copy travels as its owner received it, encoded, and every
        member decodes it as the owner did."""
        self.aggregator, self._trusted, self._member = aggregator, trusted, member
        self.lanes = lanes_for(codec, error_feedback)
        self._assigned = assigned or (lambda: None)
        self.traffic = traffic if traffic is not None else Traffic()
        self._keys: dict[str, int] = {}  # a piece's key: its index for the lanes' feedback
        self._sketches: dict[tuple[str, tuple[int, ...], str], torch.Tensor] = {}
        self._round: RoundReports | None = None
        self._keeper, self._wanted = keeper, wanted
        self._open: int | None = None  # the round whose pieces went out, not committed
        self._sent: set[str] = set()  # and the keys of its pieces sent so far
    def take(self) -> RoundReports | None:
        """The reports of the round last summed (None: none since the last take)."""
        taken, self._round = self._round, None
        return taken

    def forget(self) -> None:
        """A new membership: the ranks were renumbered, the slices are cut anew; a round
        that did not commit never sent anything that counts: its error feedback goes
        back to the round's start."""
        self._round = None
        self._sketches.clear()
        self.lanes.rollback()
        self._open = None

    def committed(self) -> None:
        """The round committed: what this sender's codec left out of it stands."""
        self.lanes.commit()
        self._open = None

    def __call__(self, piece: Piece, group: ProcessGroupLike) -> Future[torch.Tensor]:
        n, me = group.size(), group.rank()
        if self._open != piece.round or piece.key in self._sent:
            # a round's first piece (or a round started again, abandoned without a
            # commit): keep its feedback's start, and drop what an uncommitted one left
            self.lanes.begin()
            self._open, self._sent = piece.round, set()
        self._sent.add(piece.key)
        flat = piece.delta.reshape(-1)
        owners = tuple(self._trusted(n))
        if not owners:
            raise QuarantinedError(
                f"round {piece.round}: every member of the cohort is quarantined, so no "
                "pseudo-gradient counts and the global model cannot move; the trust checks "
                "fired on every member (see the events): check that every worker runs the "
                "same script, data and loss, or drop trust=")
        shares = self._shares(piece, n)
        weights = torch.tensor([shares[r] for r in owners], dtype=torch.float64)
        size = max(1, math.ceil(flat.numel() / len(owners)))
        received, width = self._scatter(piece, flat, owners, size, group)
        wanted = tuple(self._wanted(piece, owners)) if self._wanted is not None else ()
        carried = size + width * len(wanted)  # the aggregate, then each wanted lane
        stride = carried + wire.per_word(flat.dtype) * len(owners) * (FIELDS + len(owners))
        if me in owners:
            rows = received.view(len(owners), width)
            copies = rows if not self.lanes.coded else self.lanes.copies(rows, size)
            value = self.aggregator.aggregate(copies, weights.to(copies.device, copies.dtype))
            report = self._report(piece.key, owners, copies, value,
                                  [shares[r] for r in owners])
            outgoing = torch.empty(n, stride, dtype=flat.dtype, device=flat.device)
            outgoing[0, :size] = value.to(flat.dtype)
            for j, target in enumerate(wanted):  # (as it came: encoded, 4x fewer bytes in int8)
                outgoing[0, size + width * j:size + width * (j + 1)] = \
                    rows[owners.index(target)]
            outgoing[0, carried:] = wire.to_values(report.view(-1).view(torch.int64),
                                                   flat.dtype).to(flat.device)
            outgoing[1:] = outgoing[0]
        else:
            outgoing = torch.empty(0, dtype=flat.dtype, device=flat.device)
        self.traffic.sent += outgoing.numel() // n * (n - 1) * flat.element_size()
        result = torch.empty(stride * len(owners), dtype=flat.dtype, device=flat.device)
        work = group.alltoall_base(  # type: ignore[attr-defined]
            result, outgoing.view(-1), [stride if r in owners else 0 for r in range(n)],
            [stride if me in owners else 0] * n)
        wait_for(work, group, "the round's robust aggregation (gather)")
        rows = result.view(len(owners), stride)
        combined = rows[:, :size].reshape(-1)[:flat.numel()].clone()
        reports = torch.stack([wire.to_words(rows[k, carried:]).view(torch.float64)
                               .view(len(owners), FIELDS + len(owners)).cpu()
                               for k in range(len(owners))])
        if self._keeper is not None:
            self._keeper(piece, owners, wanted, [
                self.lanes.copies(rows[:, size + width * j:size + width * (j + 1)].contiguous(),
                                  size).reshape(-1)[:flat.numel()].to(flat.dtype)
                for j in range(len(wanted))])
        self._keep(piece.round, owners, [shares[r] for r in owners], reports)
        done: Future[torch.Tensor] = Future()
        done.set_result(combined.view_as(piece.delta))
        return done

    def _shares(self, piece: Piece, n: int) -> list[float]:
        """Every member's assigned part of the round: the piece's, else the loader's
        split (a piece sent mid-round), else equal."""
        shares = list(piece.shares) or list(self._assigned() or ())
        return [float(s) for s in shares] if len(shares) == n else [1.0 / n] * n

    def _scatter(self, piece: Piece, flat: torch.Tensor, owners: tuple[int, ...], size: int,
                 group: ProcessGroupLike) -> tuple[torch.Tensor, int]:
        """1. Each owner gets every trusted member's copy of its slice."""
        n, me = group.size(), group.rank()
        width = self.lanes.width(size, flat.dtype)
        index = self._keys.setdefault(piece.key, len(self._keys))

        def take(name: str, numel: int) -> torch.Tensor:
            return torch.empty(numel, dtype=flat.dtype, device=flat.device)

        sending = me in owners
        if sending:
            send = torch.empty(len(owners) * width, dtype=flat.dtype, device=flat.device)
            self.lanes.lay_out(index, flat, send.view(len(owners), width), size, take)
        else:
            send = torch.empty(0, dtype=flat.dtype, device=flat.device)
        to_each = [width if sending and r in owners else 0 for r in range(n)]
        from_each = [width if sending and r in owners else 0 for r in range(n)]
        self.traffic.sent += (sum(to_each) - to_each[me]) * flat.element_size()
        self.traffic.exchanges += 1
        received = torch.empty(sum(from_each), dtype=flat.dtype, device=flat.device)
        work = group.alltoall_base(received, send, from_each, to_each)  # type: ignore[attr-defined]
        wait_for(work, group, "the round's robust aggregation (scatter)")
        return received, width

    def _report(self, key: str, owners: tuple[int, ...], copies: torch.Tensor,
                value: torch.Tensor, shares: list[float]) -> torch.Tensor:
        """This owner's report on its slice; keeps each copy's sketch for the next round."""
        members = [self._member(r) for r in owners]
        previous = [self._sketches.get((key, owners, m)) for m in members]
        report, sketches = slice_report(copies, value, previous, shares)
        for m, s in zip(members, sketches, strict=True):
            self._sketches[(key, owners, m)] = s
        return report

    def _keep(self, round_: int, owners: tuple[int, ...], shares: list[float],
              reports: torch.Tensor) -> None:
        kept = self._round
        if kept is None or kept.round != round_ or kept.senders != owners:
            self._round = RoundReports(round_, owners, shares, reports)
        else:  # (finite: only if every piece was)
            finite = torch.minimum(kept.reports[..., FINITE], reports[..., FINITE])
            kept.reports += reports
            kept.reports[..., FINITE] = finite
            kept.shares = shares  # (the round's last piece carries the parts of the block)
