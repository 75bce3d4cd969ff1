"""``DiLoCoSync``: the sync strategy part of the step transaction for DiLoCo / Local SGD.

Between syncs every backward stays local (``DataParallel(sync_gradients=False)``) and
the inner optimizer steps alone (no collective: a fast worker never waits inside a
planned round). A round nobody is measured for yet starts with a short even segment, after
which the ranks exchange their speeds (one tiny all-reduce, no parameters) and split
the rest of the round by them (``round_plan.segments``). At the end of its part of the
round a rank runs ``synchronize``:

1. one small float64 all-gather: every rank's smoothed speed and its noise (the next
   round's plan, ``round_plan.replan_round``), samples and parts of the round's block
   (who takes part: what a lost member took with it is the rest, which the cursor owes;
   parts that overlap mean the members split the round differently, and every member
   starts it again);
2. per (device, dtype): the pseudo-gradient ``global - local``, flattened into one
   buffer and handed to the round sum (``round_sum.py``) with the rank's weight, its
   samples over the participants' (``round_plan.weight``). The default sums the
   weighted buffers through the codec (``potluck.compress``: one collective for the
   whole model, not one per tensor); buffers come from rank 0;
3. only then, with nothing left to fail, the outer optimizer steps the global
   parameters with the sum and every replica takes them.

A member lost mid-round makes a collective fail on the others before anything changed:
on an elastic cohort the transaction forms the next generation and calls
``synchronize`` again; the survivors commit the round, weighted among themselves.
Under Streaming DiLoCo the fragments applied mid-round hold the lost member's samples:
there a loss voids the round instead. The loss is raised at the round's sync (a
fragment's collective that failed mid-round is held until then, as a failed speed
exchange is), the survivors form the next generation, and the retried sync rolls the
global parameters, the outer optimizer and the error feedback back to the round's start
(``rollback.RoundStart``) and returns None: every member abandoned the round.

Its state (global parameters, outer optimizer, plan, speeds, error feedback) travels in
the live state and checkpoints under ``name``.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.futures import Future

from potluck.balance.speed import SpeedMeter
from potluck.collectives import broadcast_coalesced, settle, wait_for
from potluck.compress import ErrorFeedback, Identity, Traffic
from potluck.compress.codec import Codec
from potluck.data.state import Range
from potluck.errors import ConfigError, PeerLostError
from potluck.group import GroupHandle
from potluck.sync.config import DiLoCo
from potluck.sync.fragments import Summed, by_kind, deal, outer_step, pseudo_gradient
from potluck.sync.rollback import RoundStart, VoidedRound
from potluck.sync.round_plan import (
    agreed_lost,
    fragment_points,
    local_steps,
    plan_round,
    replan_round,
    segments,
    weight,
)
from potluck.sync.round_sum import CodecSum, Piece, RoundSum

log = logging.getLogger(__name__)

# The past's weight in a rank's round speed: a round averages many local steps already,
# so the average reaches back about two rounds. A round twice as slow or fast as the
# average is a new speed (a quota, another job on the GPU), not noise: it restarts the
# average and its spread (``SpeedMeter``'s jump). At 1.5x, rounds whose speeds scatter
# by 20% restarted now and then with a narrow spread, and the plan moved on noise.
ROUND_SMOOTHING = 0.5
ROUND_JUMP = 2.0


def _measured(value: float) -> float | None:
    """A speed or its noise as a member sent it: None where it sent none (-1) or
    nothing a plan can use (a member's bad value must not stop every member's plan)."""
    return float(value) if math.isfinite(value) and value >= 0 else None


@dataclass(frozen=True)
class RoundRecord:
    """What this rank did in its last round (for metrics and the bench)."""

    index: int  # rounds committed, this one included
    inner_steps: int
    samples: int
    compute_s: float  # its local steps, loading included
    wait_s: float  # in the speed all-reduces (the sync's, an even start's): for the slowest
    sync_s: float  # the pseudo-gradient's sum and the outer step
    sent_bytes: int  # payload bytes this rank sent for it
    lost: tuple[Range, ...] = ()  # positions of the block lost with members mid-round
    round_samples: int = 0  # samples of every member that took part (the global model's)


class InnerWatch(Protocol):
    """What hears a round's local steps (trust's spot re-run, ``watch_inner_steps``):
    ``round_began`` when a round is handed out, before its first local step (the replica
    holds the round's start); ``inner_step(done, final)`` after each local step, where
    ``final`` says the replica changes before the next one (the round's sync, or a
    Streaming DiLoCo fragment applied mid-round)."""

    def round_began(self) -> None: ...

    def inner_step(self, done: int, final: bool) -> None: ...


class DiLoCoSync:
    """A ``SyncStrategy`` (``potluck.step.parts``) and the round's share policy."""

    name = "sync"

    def __init__(self, config: DiLoCo, module: nn.Module, group: GroupHandle,
                 global_batch: int, device: torch.device | None = None,
                 on_lost: Callable[[], None] | None = None) -> None:
        """``on_lost``: on an elastic cohort, what tells the members that a peer was
        lost in the mid-round speed exchange (the cohort's ``mark_step_failed``); the
        round's sync then raises the loss before any collective, and the transaction
        forms the next generation as for any loss in a sync. None (a fixed cohort): the
        loss is raised where it happens. With fragments, ``on_lost`` also means a loss
        voids the round (see the module doc)."""
        self.config, self.module, self.group = config, module, group
        self._on_lost = on_lost
        self._voids = on_lost is not None and config.fragments > 1
        self._rank = group.rank()  # whose error feedback this is (on_membership renumbers)
        self.device = device or torch.device("cpu")  # NCCL talks in device tensors
        self.global_batch = global_batch
        self.codec: Codec = config.codec or Identity()
        self.feedback = ErrorFeedback() if config.error_feedback and config.codec else None
        self.traffic = Traffic()
        self._round_sum: RoundSum = CodecSum(self.codec, self.feedback, self.traffic)
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._fragments = deal(len(self._params), config.fragments)
        # The global parameters: what the replicas hold at the start of a round. Taken
        # again at the first round (weights loaded after prepare() count), unless a
        # live state or checkpoint gave them.
        self._global = [p.detach().clone() for p in self._params]
        self._global_set = False
        self._outer = torch.optim.SGD(self._global, lr=config.outer_lr,
                                      momentum=config.outer_momentum,
                                      nesterov=config.nesterov)
        self.plan: tuple[int, ...] | None = None  # local steps per rank (None: equal)
        self.speeds: list[float | None] = [None] * group.size()
        # This rank's speed over its rounds, smoothed, and its noise (what it sends); the
        # syncs in a row that called for a new plan (the same on every rank).
        self.meter = SpeedMeter(ROUND_SMOOTHING, skip=0, jump=ROUND_JUMP, jump_is_change=True)
        self._calls = 0
        self.rounds = 0
        self.skipped = 0  # rounds whose summed pseudo-gradient was not finite
        self.last: RoundRecord | None = None
        self._due = self._done = self._samples = 0
        # The round under way: its block, the segments it is handed out in, how many of
        # them were handed out, and this rank's part of each.
        self._block: Range = (0, 0)
        self._segments: tuple[Range, ...] = ()
        self._parts: list[Range] = []
        # A loss mid-round (the speed exchange's; a fragment's when the round voids),
        # raised at the sync.
        self._lost: PeerLostError | None = None
        # Where a round can be voided: its start, and the loss that voids it (set when
        # the loss leaves synchronize; the retry in the next generation voids the round).
        self._start: RoundStart | None = None
        self._voiding: VoidedRound | None = None
        self._applied = 0  # fragments applied in the round under way
        self.voided: list[VoidedRound] = []
        self._started = 0.0
        self._warm = 0.0  # when the round's first local step ended (its speed leaves it out)
        self._exchanged = 0.0  # seconds in the mid-round speed exchange (waiting, mostly)
        self._compute_s: float | None = None
        # Streaming: after which local steps fragments 0 .. P-2 go, the next one to go,
        # the one in flight, and the time spent waiting for them in this round.
        self._points: tuple[int, ...] = ()
        self._next = 0
        self._pending: tuple[int, list[tuple[list[int], Future[torch.Tensor]]]] | None = None
        self._blocked = 0.0
        self._watch: InnerWatch | None = None

    # ------------------------------------------------------------ share policy

    def shares(self, world_size: int) -> list[float]:
        plan = self._plan_for(world_size)
        return [float(n) for n in plan]

    def _plan_for(self, world_size: int) -> tuple[int, ...]:
        if self.config.split is not None:
            return plan_round([None] * world_size, self.config.inner_steps,
                              split=self.config.split)
        if self.plan is not None and len(self.plan) == world_size:
            return self.plan
        return (self.config.inner_steps,) * world_size

    # ------------------------------------------------------------ the round

    def segments(self, block: Range) -> tuple[Range, ...]:
        """A round begins: the segments the loader hands ``block`` out in, each split by
        ``shares`` as they stand when it is handed out (``round_plan.segments``)."""
        if self._segments:
            raise ConfigError(
                f"the loader handed out a round again after {self._done} optimizer step(s) of "
                f"its {self._due} batches so far: under sync=DiLoCo(...) call opt.step() "
                "once per batch (a skipped step would train the round twice)")
        if not self._global_set:
            with torch.no_grad():
                for value, param in zip(self._global, self._params, strict=True):
                    value.copy_(param)
            self._global_set = True
        self._start = RoundStart.take(self._global, self._outer, self.feedback) \
            if self._voids else None
        self._lost, self._voiding, self._applied = None, None, 0
        config, world_size = self.config, self.group.size()
        unplanned = (config.adaptive and config.split is None and world_size > 1
                     and (self.plan is None or len(self.plan) != world_size))
        self._block = block
        self._segments = segments(block, inner_steps=config.inner_steps,
                                  global_batch=self.global_batch, world_size=world_size,
                                  measure=config.measure, measured=not unplanned)
        self._parts, self._samples = [], 0
        self._due = self._done = 0
        self._compute_s = None
        self._points, self._next, self._blocked, self._exchanged = (), 0, 0.0, 0.0
        self._started = time.perf_counter()
        if self._watch is not None:
            self._watch.round_began()
        return self._segments

    def inner_steps(self, part: Range, segment: Range, counted: int | None = None) -> int:
        """The loader hands out this rank's part of the round's next segment (positions
        in the epoch): its local steps. ``counted``: the members whose work counts, where
        fewer than the group (a quarantined member sits out on a fixed cohort): a local
        step's batch is then what it would be in a cohort of that many."""
        at = len(self._parts)
        if at >= len(self._segments) or segment != self._segments[at]:
            raise ConfigError(
                f"the loader handed out positions {list(segment)} where the round "
                f"{list(self._block)} expects its segments {[list(s) for s in self._segments]} "
                "in turn: a round begins with segments(block)")
        if self._done < self._due:
            raise ConfigError(
                f"the loader handed out the rest of the round after {self._done} of the "
                f"{self._due} local steps of its start: the rest is split by speeds measured "
                "over the start, so take a batch only after opt.step() of the one before "
                "(no reading ahead)")
        self._parts.append(part)
        samples = part[1] - part[0]
        self._samples += samples
        steps = local_steps(samples, self.global_batch, counted or self.group.size())
        before, self._due = self._due, self._due + steps
        if at + 1 == len(self._segments):  # fragments go spread over the last segment
            self._points = tuple(before + point
                                 for point in fragment_points(steps, len(self._fragments)))
        return steps

    def after_inner_step(self) -> bool:
        if self._due == 0:
            raise ConfigError("a local step outside a round: under sync=DiLoCo(...) take "
                              "batches from prepare's loader, one optimizer step each")
        self._done += 1
        if self._done == 1:
            self._warm = time.perf_counter()
        if self._watch is not None:
            self._watch.inner_step(self._done, self._changes_next())
        while self._lost is None and self._next < len(self._points) \
                and self._points[self._next] <= self._done:
            self._send_fragment()
        if self._done < self._due:
            return False
        if len(self._parts) < len(self._segments):  # a measuring start ends here
            if self._lost is None:  # (after a loss the group is broken: the rest is even)
                self._exchange_speeds()
            return False
        return True

    def _changes_next(self) -> bool:
        """Whether the replica changes before the next local step: the round ends here,
        or a fragment in flight is applied before the next one is sent."""
        if self._done >= self._due and len(self._parts) == len(self._segments):
            return True
        sends = sum(1 for point in self._points[self._next:] if point <= self._done)
        return self._lost is None and (sends >= 2 or (sends == 1 and self._pending is not None))

    def watch_inner_steps(self, watch: InnerWatch) -> None:
        """``watch`` hears every round's start and local steps from the next round on."""
        self._watch = watch

    def _exchange_speeds(self) -> None:
        """Mid-round, after an even start: every rank's speed so far (leaving out the
        first local step, which pays for warming up), so the rest of the round follows a
        plan. A loss here on an elastic cohort leaves the plan as it was (the rest even)
        and is raised at the round's sync, where the members' parts say whether they
        still split the round alike (``agreed_lost``)."""
        began = time.perf_counter()
        group = self.group
        if self._done > 1:
            samples = self._samples * (self._done - 1) / self._done
            seconds = began - self._warm
        else:
            samples, seconds = self._samples, began - self._started
        mine = torch.tensor([samples / max(seconds, 1e-9)], dtype=torch.float64,
                            device=self.device)
        table = [torch.empty_like(mine) for _ in range(group.size())]
        try:
            settle(lambda: group.allgather([table], [mine]), group,
                   "the round's first speeds")
        except PeerLostError as exc:
            if self._on_lost is None:
                raise
            log.warning("round %d: the speeds after its even start could not be exchanged "
                        "(%s); the rest of the round stays even", self.rounds + 1, exc)
            self._hold(exc)
        else:
            self.speeds = [float(v) for v in torch.cat(table).cpu().tolist()]
            self.plan = plan_round(self.speeds, self.config.inner_steps,
                                   min_gain=self.config.min_gain)
        spent = time.perf_counter() - began
        self._blocked += spent
        self._exchanged += spent

    def _hold(self, exc: PeerLostError) -> None:
        """A loss mid-round on an elastic cohort: the members are told at once (so none
        waits for a collective that cannot complete), and it is raised at the round's
        sync, where every survivor forms the next generation at about the same time.
        Until then this rank sends nothing more of the round."""
        self._lost, self._pending = exc, None
        assert self._on_lost is not None
        self._on_lost()

    # ------------------------------------------------------------ streaming

    def _send_fragment(self) -> None:
        """Streaming DiLoCo: finish the fragment in flight (its outer step and merge),
        then send the next one's pseudo-gradient and go on training meanwhile."""
        began = time.perf_counter()
        try:
            self._finish_fragment()
            index = self._next
            self._next = index + 1
            self._pending = (index, self._start_fragment(index))
        except PeerLostError as exc:
            if not self._voids:
                raise
            log.warning("round %d: a fragment's sum failed (%s); the round is void, and "
                        "the loss is raised at its sync", self.rounds + 1, exc)
            self._hold(exc)
        self._blocked += time.perf_counter() - began

    def _start_fragment(self, index: int) -> list[tuple[list[int], Future[torch.Tensor]]]:
        share = weight(self._samples, self._block[1] - self._block[0])
        return [(members, self._issue(members, share, index, f"/{index}"))
                for members in by_kind(self._params, self._fragments[index])]

    def _issue(self, members: list[int], share: float, fragment: int,
               suffix: str, shares: tuple[float, ...] = (),
               held: tuple[tuple[Range, ...], ...] = ()) -> Future[torch.Tensor]:
        """This rank's pseudo-gradient of ``members`` handed to the round sum."""
        with torch.no_grad():
            delta = pseudo_gradient(self._global, self._params, members)
        piece = Piece(delta, share, f"{delta.device}/{delta.dtype}{suffix}", fragment,
                      self.rounds + 1, tuple(members), shares, held)
        try:
            with torch.no_grad():
                return self._round_sum(piece, self.group)
        except RuntimeError as exc:  # a backend that already knows a peer is gone
            raise PeerLostError.from_failure(
                f"fragment {fragment}'s pseudo-gradient", exc, rank=self.group.rank(),
                generation=self.group.generation) from exc

    @property
    def global_parameters(self) -> list[torch.Tensor]:
        """The global parameters, which every replica holds alike after a round's sync
        (trust fingerprints them, and repairs a diverged one in place)."""
        return self._global

    @property
    def outer_state(self) -> list[torch.Tensor]:
        """The outer optimizer's state tensors (momentum), in the global parameters'
        order: with them, a replica repaired from another is that replica (``trust``)."""
        found: list[torch.Tensor] = []
        for value in self._global:
            state = self._outer.state.get(value, {})
            found += [state[k] for k in sorted(state) if isinstance(state[k], torch.Tensor)]
        return found

    @property
    def fragments(self) -> int:
        """How many fragments a round's pseudo-gradient is sent in (1: DiLoCo)."""
        return len(self._fragments)

    @property
    def round_sum(self) -> RoundSum:
        """What combines the members' pseudo-gradients (``round_sum.py``)."""
        return self._round_sum

    def register_round_sum(self, round_sum: RoundSum) -> None:
        """Combine the pseudo-gradients with ``round_sum`` from the next one sent on
        (every member registers the same kind, before its first round)."""
        if not callable(round_sum):
            raise ConfigError(f"register_round_sum({round_sum!r}): pass a RoundSum, a "
                              "callable (piece, group) -> Future (potluck.sync.round_sum)")
        self._round_sum = round_sum

    def _finish_fragment(self) -> None:
        if self._pending is None:
            return
        index, works = self._pending
        self._pending = None
        sums = [(members, wait_for(future, self.group, f"fragment {index}'s pseudo-gradient"))
                for members, future in works]
        if not outer_step(self._global, self._params, self._outer, sums, self.config.mixing):
            self._skip(f"fragment {index}")
        self._applied += 1

    def synchronize(self) -> tuple[Range, ...] | None:
        """The round's collectives, then the outer step. Every collective comes before
        anything changes here, so a lost peer (``PeerLostError``) leaves this rank's
        replica, global parameters and error feedback as they were: the survivors call
        it again in the next generation and commit the round among themselves. With
        fragments on an elastic cohort, the earlier fragments were applied already: the
        retry voids the round instead (``_void``). None: every member abandoned the
        round, the same decision everywhere (the members split it differently, which
        they all see in the same table; or a loss voided it, which every survivor
        raised here)."""
        if self._compute_s is None:  # a retry after a loss keeps the first measurement
            self._compute_s = time.perf_counter() - self._started - self._blocked
            self.meter.add(self._samples, self._compute_s)
        if self._voiding is not None:  # the retry in the next generation
            self._void()
            return None
        try:
            if self._lost is not None:  # held since mid-round: the group is broken
                failure, self._lost = self._lost, None
                raise failure
            return self._sync(self._compute_s)
        except PeerLostError as exc:
            if self._voids:
                self._voiding = VoidedRound(self.rounds + 1, self._applied, str(exc))
            raise

    def _sync(self, compute_s: float) -> tuple[Range, ...] | None:
        began = time.perf_counter()
        self._finish_fragment()  # the one sent last, still in flight
        group, world_size = self.group, self.group.size()
        # Who takes part, with what: speed (samples/s), samples, then its part of each
        # segment [start, stop) (a round has at most two), then its speed's noise (-1:
        # not measured).
        parts = [*self._parts, (0, 0)][:2]
        speed, noise = self.meter.speed, self.meter.uncertainty
        mine = torch.tensor([self._samples / max(compute_s, 1e-9) if speed is None else speed,
                             self._samples, *parts[0], *parts[1],
                             -1.0 if noise is None else noise],
                            dtype=torch.float64, device=self.device)
        table = [torch.empty_like(mine) for _ in range(world_size)]
        waiting = time.perf_counter()
        # (gathered, not summed: a member writes its own row and no other's)
        settle(lambda: group.allgather([table], [mine]), group,
               "the round's speeds and parts")
        waited = time.perf_counter() - waiting
        rows = torch.stack(table).cpu().tolist()
        lost = agreed_lost(self._block, [(int(r[c]), int(r[c + 1])) for r in rows
                                         for c in (2, 4)])
        if lost is None or (lost and len(self._fragments) > 1):
            if len(self._fragments) > 1 and self._start is None:
                # Not reached: only a loss splits a round differently or loses a part of
                # it, and a fixed cohort raises a loss (an elastic one voids the round).
                raise RuntimeError(
                    f"round {self.rounds + 1} of StreamingDiLoCo(fragments="
                    f"{len(self._fragments)}): the members' parts of it {rows} do not "
                    "cover its block once, and its first fragments were applied already, "
                    "so it cannot start again on a fixed cohort")
            log.warning("round %d: the members split it differently (a member was lost "
                        "while they exchanged speeds); every member starts it again",
                        self.rounds + 1)
            # The same table everywhere: every member takes the same plan from it.
            self.speeds = [float(r[0]) for r in rows]
            self.plan = plan_round(self.speeds, self.config.inner_steps,
                                   min_gain=self.config.min_gain)
            self.abandon_round()
            return None
        round_samples = sum(int(r[1]) for r in rows)
        share = weight(self._samples, round_samples)
        # Every member's weight from its part of the block (the parts tile it: checked
        # above), for a round sum that weighs every copy itself (trust's).
        assigned = [(r[3] - r[2]) + (r[5] - r[4]) for r in rows]
        shares = tuple(a / sum(assigned) for a in assigned) if sum(assigned) > 0 else ()
        held = tuple(tuple((int(r[c]), int(r[c + 1])) for c in (2, 4) if r[c + 1] > r[c])
                     for r in rows)
        sent_before = self.traffic.sent
        saved = self.feedback.snapshot() if self.feedback is not None else None
        try:
            sums = self._sum_pseudo_gradients(share, self._fragments[-1], shares, held)
            buffers = list(self.module.buffers())
            if buffers and world_size > 1:
                broadcast_coalesced(buffers, group, src=0)
        except PeerLostError:
            if self.feedback is not None and saved is not None:
                self.feedback.restore(saved)  # nothing of this attempt was sent
            raise
        if not outer_step(self._global, self._params, self._outer, sums, self.config.mixing):
            self._skip("the round")
        self.rounds += 1
        self.last = RoundRecord(self.rounds, self._due, self._samples, compute_s,
                                waited + self._exchanged,
                                time.perf_counter() - began - waited + self._blocked
                                - self._exchanged,
                                self.traffic.sent - sent_before, lost, round_samples)
        self.speeds = [_measured(r[0]) for r in rows]
        if self.config.adaptive:
            self.plan, self._calls = replan_round(
                self.speeds, [_measured(r[6]) for r in rows], self.config.inner_steps,
                current=self.plan, calls=self._calls, min_gain=self.config.min_gain)
        self._due, self._segments, self._parts, self._start = 0, (), [], None
        if lost:
            log.warning("round %d committed without positions %s of its block %s (members "
                        "lost mid-round): they are handed out again", self.rounds,
                        list(lost), self._block)
        return lost

    def _sum_pseudo_gradients(self, share: float, fragment: list[int],
                              shares: tuple[float, ...] = (),
                              held: tuple[tuple[Range, ...], ...] = ()) -> Summed:
        """Per (device, dtype): this rank's pseudo-gradient of ``fragment``, combined
        over the ranks by the round sum (one collective each)."""
        last = len(self._fragments) - 1
        suffix = f"/{last}" if last else ""
        works = [(members, self._issue(members, share, last, suffix, shares, held))
                 for members in by_kind(self._params, fragment)]
        return [(members, wait_for(future, self.group, "the round's pseudo-gradient"))
                for members, future in works]

    def _skip(self, what: str) -> None:
        self.skipped += 1
        log.warning("round %d: the summed pseudo-gradient of %s is not finite; the global "
                    "parameters stay, every replica restarts from them (%d skipped)",
                    self.rounds + 1, what, self.skipped)

    def _void(self) -> None:
        """A loss voided the round (Streaming DiLoCo, elastic): every survivor gets here
        in the next generation, whatever it saw of the round's fragments."""
        assert self._voiding is not None
        self.voided.append(self._voiding)
        log.warning("round %d is void: a member was lost after %d of its %d fragments were "
                    "applied here (%s); they are rolled back, every replica restarts from "
                    "the round's start, and the whole round is handed out again",
                    self._voiding.index, self._voiding.applied, len(self._fragments),
                    self._voiding.cause)
        self.abandon_round()

    def abandon_round(self) -> None:
        """The round under way is dropped: the global parameters, the outer optimizer
        and the error feedback go back to the round's start where it was kept (the
        fragments applied are undone), the replica restarts from the global
        parameters, and the loader hands the round out again."""
        start, self._start = self._start, None
        if start is not None:
            start.restore(self._global, self._outer, self.feedback)
        self._due, self._pending, self._next, self._applied = 0, None, 0, 0
        self._segments, self._parts, self._lost, self._voiding = (), [], None, None
        with torch.no_grad():
            for param, value in zip(self._params, self._global, strict=True):
                param.copy_(value)

    @property
    def applied(self) -> int:
        """Fragments of the round under way applied so far (Streaming DiLoCo)."""
        return self._applied

    def unsynced(self) -> int:
        return self._done if self._due else 0

    # ------------------------------------------------------------ step part

    def on_commit(self, steps: int) -> None:
        """The round committed (``synchronize`` did the work)."""

    def on_membership(self, rank: int, world_size: int) -> None:
        self.plan, self.speeds, self._rank = None, [None] * world_size, rank
        self._calls = 0

    def state_dict(self) -> dict[str, Any]:
        """The committed state: mid-round, where the round's start is kept, that start
        (the fragments applied since are not committed)."""
        start = self._start
        global_ = start.global_ if start is not None else self._global
        outer = start.outer_state() if start is not None else self._outer.state_dict()
        feedback = {} if self.feedback is None else self.feedback.state_dict()
        if start is not None and start.feedback is not None:
            feedback = {key: value.cpu() for key, value in start.feedback.items()}
        return {"policy": self.config.strategy,
                "global": [g.detach().clone() for g in global_],
                "outer": outer, "plan": self.plan,
                "speeds": list(self.speeds), "rounds": self.rounds,
                "feedback": feedback, "feedback_rank": self._rank}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("policy") != self.config.strategy:
            raise ConfigError(
                f"the live state was made with sync {state.get('policy')!r}, but this worker "
                f"runs {self.config.strategy!r}: every worker of a job must run the same "
                "script with the same potluck.prepare(...) arguments")
        self._start = None  # what is loaded replaces this rank's round, its start too
        with torch.no_grad():
            for mine, saved in zip(self._global, state["global"], strict=True):
                mine.copy_(saved)
        self._global_set = True
        # The replica restarts from the committed global parameters: a state captured
        # mid-round (a realign after a loss) carries its sender's half-trained replica.
        self.abandon_round()
        # A copy: torch's optimizer keeps the tensors it is given (the caller's state)
        self._outer.load_state_dict(copy.deepcopy(state["outer"]))
        self.plan = None if state["plan"] is None else tuple(state["plan"])
        self._calls = 0  # (every rank that loads a state starts counting again)
        self.speeds, self.rounds = list(state["speeds"]), int(state["rounds"])
        # Error feedback is each rank's own: what its codec left out of its own sends. A
        # state from another rank (a joiner's, a realign's, every resumed rank's but the
        # one that saved it) would count that rank's residual twice: this rank keeps its
        # own (empty in a new process).
        if self.feedback is not None and state.get("feedback_rank", 0) == self._rank \
                and not self.feedback.state_dict():
            self.feedback.load_state_dict(state["feedback"])
