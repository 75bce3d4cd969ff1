"""The step boundary: leave, admission and the minimum size, decided by every member alike.

After each committed step of an elastic cohort, one tiny MAX all-reduce of
``[leaving, joiners pending]`` is the vote. A leaver writes its leave key *before* it,
so whoever decides sees it; rank 0 looks for joiners every ``admit_every`` steps. Only
when a flag is up does every member call the rendezvous (``cohort.boundary()``);
joiners then receive the live state from rank 0 of the new generation.

Below ``MinimumSize.workers`` (after a loss or a leave) the cohort does not train: it
polls for joiners (one tiny all-reduce per poll keeps the members in step; rank 0's
view of the queue and rank 0's clock decide) and admits them as at a boundary. If none
came within ``MinimumSize.timeout`` seconds, rank 0 writes the live state as a
checkpoint and every member raises ``BelowMinimumError``.

The decisions (``boundary_action``, ``poll_action``) are pure functions of the voted
flags; the class around them does the I/O. A fixed (non-elastic) cohort has no
boundary: nothing can join or leave it, so no vote is spent.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from potluck.cohort import Cohort
from potluck.collectives import allreduce_max
from potluck.errors import BelowMinimumError, PeerLostError
from potluck.step.live_state import LiveState, Progress
from potluck.step.minimum import MinimumSize

_POLL = 0.25  # seconds between polls for joiners while below the minimum

log = logging.getLogger(__name__)


class Action(enum.Enum):
    GO_ON = "go on"
    ADMIT = "admit"  # every member calls the rendezvous' boundary
    STOP = "stop"  # below the minimum past its deadline: checkpoint and stop


def boundary_action(flags: Sequence[float]) -> Action:
    """``flags`` = MAX over members of ``[leaving, joiners pending]``."""
    return Action.ADMIT if any(flags) else Action.GO_ON


def poll_action(flags: Sequence[float]) -> Action:
    """``flags`` = MAX over members of ``[joiners pending, deadline passed]`` (rank 0's)."""
    if flags[0]:
        return Action.ADMIT
    return Action.STOP if flags[1] else Action.GO_ON


class Boundary:
    """Runs the boundary protocol for one member; ``changed`` hears of new generations."""

    def __init__(self, cohort: Cohort, state: LiveState, progress: Progress,
                 minimum: MinimumSize, checkpoint_dir: Path, *, admit_every: int = 1,
                 changed: Callable[[], None] = lambda: None) -> None:
        self._cohort, self._state, self._progress = cohort, state, progress
        self.minimum, self.checkpoint_dir = minimum, checkpoint_dir
        self._admit_every, self._changed = admit_every, changed
        self.left = False  # this worker has left the cohort: stop training
        self.waited_s = 0.0  # time spent below the minimum, waiting for joiners
        self._leave_requested = False

    def request_leave(self) -> None:
        """Leave at the next step boundary (e.g. from a SIGTERM handler)."""
        self._leave_requested = True

    def after_commit(self, expel: bool = False) -> None:
        """Every member, after a committed step: the vote, then admission if asked;
        ``expel``: a member was quarantined (its leave key is written): move on now."""
        cohort = self._cohort
        if not cohort.elastic:
            return
        if self._leave_requested:
            cohort.leave()  # the key is in the store before the flag travels
        pending = (cohort.rank == 0 and self._progress.steps % self._admit_every == 0
                   and cohort.pending_joiners())
        flags = torch.tensor([float(self._leave_requested or expel), float(pending)],
                             device=cohort.device)
        try:
            allreduce_max(flags, cohort.group, "the boundary vote")
        except PeerLostError:  # a peer died right after the step: the next step recovers
            cohort.mark_step_failed()  # and nobody waits here for this member
            flags.zero_()
        if self._leave_requested:  # gone whatever the vote said: it announced already
            self.left = True
            log.warning("[rank %d] left the cohort after step %d; the others train on. "
                        "Code after the loop runs here too: save or report the run's "
                        "result under `if opt.finish():` (False on a worker that left)",
                        cohort.rank, self._progress.steps)
            return
        if boundary_action(flags.tolist()) is Action.ADMIT:
            self._admit()
            self.hold_minimum()

    def hold_minimum(self) -> None:
        """Below the minimum: wait for joiners; at the deadline checkpoint and stop."""
        cohort = self._cohort
        if cohort.world_size >= self.minimum.workers:
            return
        started = time.monotonic()
        deadline = started + self.minimum.timeout
        log.warning("[rank %d] %d worker(s), below min_workers=%d: waiting up to %g s for "
                    "workers to join", cohort.rank, cohort.world_size, self.minimum.workers,
                    self.minimum.timeout)
        while cohort.world_size < self.minimum.workers:
            time.sleep(_POLL)
            leader = cohort.rank == 0
            flags = torch.tensor([float(leader and cohort.pending_joiners()),
                                  float(leader and time.monotonic() > deadline)],
                                 device=cohort.device)
            try:
                allreduce_max(flags, cohort.group, "the wait for joiners")
            except PeerLostError:  # another member died while waiting
                self._recover("a collective failed while waiting for workers")
                continue
            action = poll_action(flags.tolist())
            if action is Action.ADMIT:
                self._admit()
            elif action is Action.STOP:
                self.waited_s += time.monotonic() - started
                self._stop_below_minimum()
        self.waited_s += time.monotonic() - started
        log.warning("[rank %d] %d workers again after %.1f s: training goes on",
                    cohort.rank, cohort.world_size, time.monotonic() - started)

    def _admit(self) -> None:
        """Every member: admit the joiners, drop the leavers, hand joiners the state; if
        that fails (a joiner died or stalled), the members go on without them."""
        cohort = self._cohort
        if not cohort.boundary():
            return
        self._changed()
        if cohort.membership.joined:
            try:
                self._state.send(cohort)
            except PeerLostError:  # a joiner, or a member, was lost during the broadcast
                cohort.mark_step_failed()  # (those still in it give up at once)
                self._recover("the live state's broadcast failed")

    def _recover(self, why: str) -> None:
        """The next generation, then the realignment every recovery does: a joiner that
        took the state and members that went on to the step recover by the step's path
        (``StepTransaction``), which realigns too, so both sides run one protocol."""
        self._cohort.recover(why)
        self._state.realign(self._cohort)
        self._changed()

    def _stop_below_minimum(self) -> None:
        cohort = self._cohort
        saved = self._state.save(cohort, self.checkpoint_dir)
        # Nobody exits before the file is complete.
        allreduce_max(torch.zeros(1, device=cohort.device), cohort.group, "the stop")
        where = saved or f"{self.checkpoint_dir} (written by rank 0)"
        raise BelowMinimumError(
            self.minimum.stop_message(cohort.world_size, self._progress.steps, where),
            checkpoint=saved)
