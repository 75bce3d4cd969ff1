"""``ElasticOptimizer``: the commit point of the step transaction, and the step boundary.

``step()`` applies the update only if every collective of the step succeeded (the model
is a ``DataParallel`` with ``on_failure="abandon"``); then the data cursor commits. If
the step failed, it moves the cohort to the next generation, hands the new group to the
model and the optimizer, and leaves the cursor where it was: the ``ElasticLoader``
hands out the same slice again, split among the survivors.

After a committed step comes the boundary: one tiny MAX all-reduce of
``[leaving, joiners pending]``. A leaver writes its leave key *before* it, so whoever
decides the boundary sees it; rank 0 looks for joiners every ``admit_every`` steps.
Only when a flag is up does every member call the rendezvous' ``admit()``; joiners then
receive the live state (model, optimizer, cursor, step, bucket order) from rank 0 of
the new generation: no disk checkpoint is needed to grow the cohort.

Below ``MinimumSize.workers`` (after a loss or a leave) the cohort does not train: it polls for
joiners (one tiny all-reduce per poll keeps the members in step) and admits them as at
a boundary. If none came within ``MinimumSize.timeout`` seconds, rank 0 writes the live
state as a checkpoint and every member raises ``BelowMinimumError``; a later run with
``resume=True`` starts from that checkpoint.
"""

from __future__ import annotations

import logging
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from potluck.checkpoint import CheckpointManager
from potluck.collectives import allgather_tensor, allreduce_max, broadcast_object
from potluck.data import DataCursor
from potluck.elastic.cohort import ElasticCohort
from potluck.elastic.minimum import MinimumSize
from potluck.errors import BelowMinimumError, RendezvousError
from potluck.step import GuardedOptimizer, StepResult

DEFAULT_CHECKPOINT_DIR = "potluck-elastic-checkpoints"
# How long members wait for an admitted joiner to take the live state: its own setup
# between joining and building the ElasticOptimizer (say, a first optimizer's imports)
# may take seconds. A joiner that dies meanwhile is noticed at once (closed connection).
STATE_TIMEOUT = timedelta(seconds=120)
_POLL = 0.25  # seconds between polls for joiners while below the minimum

log = logging.getLogger(__name__)


class ElasticOptimizer:
    """Wraps a ``GuardedOptimizer``; call ``step()`` once per batch, as usual."""

    def __init__(self, optimizer: GuardedOptimizer, model: Any, cohort: ElasticCohort,
                 cursor: DataCursor, *, admit_every: int = 1,
                 minimum: MinimumSize | None = None, checkpoint_dir: str | Path | None = None,
                 resume: bool = False) -> None:
        """``minimum`` defaults to the cohort's (``potluck run --min-workers``); ``resume``
        starts the founders from the newest checkpoint in ``checkpoint_dir`` (written
        when the cohort stopped below its minimum), if there is one."""
        self.optimizer, self.model, self.cohort, self.cursor = optimizer, model, cohort, cursor
        optimizer.model = model  # a failed step must never be applied
        optimizer.set_group(cohort.group)
        # A member that gave up on a step says so; the others stop waiting for it.
        model.reducer.abandoned_elsewhere = cohort.step_failed_elsewhere
        optimizer.abandoned = cohort.step_failed_elsewhere
        self.admit_every = admit_every
        self.minimum = cohort.minimum if minimum is None else minimum
        self.checkpoint_dir = Path(checkpoint_dir or DEFAULT_CHECKPOINT_DIR)
        self.steps = 0  # committed global steps, the same on every member
        self.redone = 0
        self.waited_s = 0.0  # time spent below min_workers, waiting for joiners
        self.left = False  # this worker has left the cohort: stop training
        self._leave_requested = False
        if cohort.joined_late:
            self._receive_state()
        elif resume:
            self._resume()
        self._hold_minimum()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def request_leave(self) -> None:
        """Leave at the next step boundary (e.g. from a SIGTERM handler)."""
        self._leave_requested = True

    def leave_on_sigterm(self) -> None:
        """SIGTERM (the owner wants the GPU back) finishes the step, then leaves."""
        signal.signal(signal.SIGTERM, lambda signum, frame: self.request_leave())

    def step(self) -> StepResult:
        result = self.optimizer.step()
        if result.failed:
            self.redone += 1
            self.cohort.mark_step_failed()
            self.cohort.recover("a collective of the step failed")
            self._use_group()
            self._realign()
            self._hold_minimum()
            return result
        self.cursor.commit()  # committed, or skipped for a non-finite gradient: done
        self.steps += 1
        self._boundary()
        return result

    def _boundary(self) -> None:
        if self._leave_requested:
            self.cohort.leave()  # the key is in the store before the flag travels
        pending = (self.cohort.rank == 0 and self.steps % self.admit_every == 0
                   and bool(self.cohort.rendezvous.pending_joiners()))
        flags = torch.tensor([float(self._leave_requested), float(pending)])
        try:
            allreduce_max(flags, self.cohort.group, abandoned=self.cohort.step_failed_elsewhere)
        except RuntimeError:  # a peer died right after the step: the next step recovers
            self.cohort.mark_step_failed()  # and nobody waits here for this member
            flags.zero_()
        if self._leave_requested:  # gone whatever the vote said: it announced already
            self.left = True
            log.warning("[rank %d] left the cohort after step %d", self.cohort.rank,
                        self.steps)
            return
        if flags.any():
            self._admit()
            self._hold_minimum()

    def _admit(self) -> None:
        """Every member: admit the joiners, drop the leavers, hand joiners the state."""
        before = self.cohort.generation
        membership = self.cohort.boundary()
        if membership.generation != before:
            self._use_group()
            if membership.joined:
                self._send_state()

    def _send_state(self) -> None:
        """Rank 0 hands the joiners the live state; if that fails (a joiner died or
        stalled past ``STATE_TIMEOUT``), the members go on without them."""
        try:
            broadcast_object(self._state() if self.cohort.rank == 0 else None,
                             self.cohort.group, timeout=STATE_TIMEOUT)
        except RuntimeError:
            self.cohort.recover("a joiner did not take the live state")
            self._use_group()

    def _hold_minimum(self) -> None:
        """Below ``min_workers``: wait for joiners; at the deadline checkpoint and stop.

        Rank 0's clock and rank 0's view of the join queue decide, and every poll is one
        MAX all-reduce of ``[joiners pending, time is up]``, so all members act alike.
        """
        if self.cohort.world_size >= self.minimum.workers:
            return
        started = time.monotonic()
        deadline = started + self.minimum.timeout
        log.warning("[rank %d] %d worker(s), below min_workers=%d: waiting up to %g s for "
                    "workers to join", self.cohort.rank, self.cohort.world_size,
                    self.minimum.workers, self.minimum.timeout)
        while self.cohort.world_size < self.minimum.workers:
            time.sleep(_POLL)
            leader = self.cohort.rank == 0
            flags = torch.tensor([
                float(leader and bool(self.cohort.rendezvous.pending_joiners())),
                float(leader and time.monotonic() > deadline)])
            try:
                allreduce_max(flags, self.cohort.group)
            except RuntimeError:  # another member died while waiting
                self.cohort.recover("a collective failed while waiting for workers")
                self._use_group()
                continue
            if flags[0]:
                self._admit()
            elif flags[1]:
                self.waited_s += time.monotonic() - started
                self._stop_below_minimum()
        self.waited_s += time.monotonic() - started
        log.warning("[rank %d] %d workers again after %.1f s: training goes on",
                    self.cohort.rank, self.cohort.world_size, time.monotonic() - started)

    def _stop_below_minimum(self) -> None:
        manager = CheckpointManager(self.checkpoint_dir, rank=self.cohort.rank)
        saved = manager.save(self.steps, self._state()).path
        done = torch.zeros(1)
        allreduce_max(done, self.cohort.group)  # nobody exits before the file is complete
        where = str(saved) if saved else f"{self.checkpoint_dir} (written by rank 0)"
        raise BelowMinimumError(
            self.minimum.stop_message(self.cohort.world_size, self.steps, where),
            checkpoint=str(saved) if saved else None)

    def _resume(self) -> None:
        """Founders start from the newest checkpoint, as read by rank 0."""
        checkpoint = None
        if self.cohort.rank == 0:
            checkpoint = CheckpointManager(self.checkpoint_dir, rank=0).load_latest()
        state = broadcast_object(checkpoint.state if checkpoint else None, self.cohort.group)
        if state is not None:
            self._load(state)
            log.warning("[rank %d] resumed at step %d from %s", self.cohort.rank,
                        self.steps, self.checkpoint_dir)

    def _use_group(self) -> None:
        self.model.set_group(self.cohort.group)
        self.optimizer.set_group(self.cohort.group)

    def _state(self) -> dict[str, Any]:
        return {"model": self.model.module.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "cursor": self.cursor.state_dict(), "steps": self.steps,
                "bucket_order": self.model.reducer.bucket_order()}

    def _realign(self) -> None:
        """Members of the new generation may be one step apart: a peer that died after
        some members had finished the step's last collective (they committed) but before
        others had (they abandoned). The most advanced member's state wins."""
        steps = torch.tensor([self.steps], dtype=torch.int64)
        counts = [int(t.item()) for t in allgather_tensor(steps, self.cohort.group)]
        if len(set(counts)) == 1:
            return
        source = counts.index(max(counts))
        state = broadcast_object(self._state() if self.cohort.rank == source else None,
                                 self.cohort.group, src=source)
        if self.cohort.rank != source:
            self._load(state)
        log.warning("[rank %d] members were at steps %s after recovery; all take step %d",
                    self.cohort.rank, counts, max(counts))

    def _receive_state(self) -> None:
        try:
            state = broadcast_object(None, self.cohort.group, timeout=STATE_TIMEOUT)
        except RuntimeError as exc:
            raise RendezvousError(
                f"[rank {self.cohort.rank}] admitted, but the live state did not arrive "
                f"within {STATE_TIMEOUT.total_seconds():g} s ({exc}); the cohort went on "
                "without this worker: start it again to rejoin (and build the model and "
                "optimizer before potluck.elastic.init(), so joining is quick)"
            ) from exc
        self._load(state)
        log.warning("[rank %d] joined at step %d with the cohort's live state",
                    self.cohort.rank, self.steps)

    def _load(self, state: dict[str, Any]) -> None:
        self.model.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.cursor.load_state_dict(state["cursor"])
        self.steps = state["steps"]
        self.model.reducer.adopt_bucket_order(state["bucket_order"])
