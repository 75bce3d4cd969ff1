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
"""

from __future__ import annotations

import logging
import signal
from typing import Any

import torch

from potluck.collectives import allgather_tensor, allreduce_max, broadcast_object
from potluck.data import DataCursor
from potluck.elastic.cohort import ElasticCohort
from potluck.step import GuardedOptimizer, StepResult

log = logging.getLogger(__name__)


class ElasticOptimizer:
    """Wraps a ``GuardedOptimizer``; call ``step()`` once per batch, as usual."""

    def __init__(self, optimizer: GuardedOptimizer, model: Any, cohort: ElasticCohort,
                 cursor: DataCursor, *, admit_every: int = 1) -> None:
        self.optimizer, self.model, self.cohort, self.cursor = optimizer, model, cohort, cursor
        optimizer.model = model  # a failed step must never be applied
        optimizer.set_group(cohort.group)
        self.admit_every = admit_every
        self.steps = 0  # committed global steps, the same on every member
        self.redone = 0
        self.left = False  # this worker has left the cohort: stop training
        self._leave_requested = False
        if cohort.joined_late:
            self._receive_state()

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
            self.cohort.recover("a collective of the step failed")
            self._use_group()
            self._realign()
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
            allreduce_max(flags, self.cohort.group)
        except RuntimeError:  # a peer died right after the step: the next step recovers
            flags.zero_()
        if self._leave_requested:  # gone whatever the vote said: it announced already
            self.left = True
            log.warning("[rank %d] left the cohort after step %d", self.cohort.rank,
                        self.steps)
            return
        if flags.any():
            before = self.cohort.generation
            membership = self.cohort.boundary()
            if membership.generation != before:
                self._use_group()
                if membership.joined:
                    self._send_state()

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

    def _send_state(self) -> None:
        broadcast_object(self._state() if self.cohort.rank == 0 else None, self.cohort.group)

    def _receive_state(self) -> None:
        self._load(broadcast_object(None, self.cohort.group))
        log.warning("[rank %d] joined at step %d with the cohort's live state",
                    self.cohort.rank, self.steps)

    def _load(self, state: dict[str, Any]) -> None:
        self.model.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.cursor.load_state_dict(state["cursor"])
        self.steps = state["steps"]
        self.model.reducer.adopt_bucket_order(state["bucket_order"])
