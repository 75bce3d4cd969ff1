"""What to do after one attempt of the local worker set (finish, restart, or give up),
when an elastic agent ends a worker that is still running (``why_end``), and which
agents node 0 still waits for at the end of an elastic job (``roll_call``).

Pure, so all are tested without processes or a store.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol


class ErrorRecordLike(Protocol):
    """A worker's recorded error (``report.ErrorRecord``): its exception's class name."""

    @property
    def exc_type(self) -> str: ...


class Outcome(Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"  # elastic: the cohort checkpointed and stopped below its minimum
    NO_COHORT = "no cohort"
    """Elastic: a worker of a plain torch.distributed group was lost (it never joined a
    cohort, none formed): only a restart of the whole worker set helps."""


class Action(Enum):
    FINISH = "finish"
    RESTART = "restart"
    GIVE_UP = "give up"


def next_action(outcome: Outcome, restarts_done: int, max_restarts: int) -> Action:
    if outcome is Outcome.SUCCEEDED:
        return Action.FINISH
    if outcome is Outcome.FAILED and restarts_done < max_restarts:
        return Action.RESTART
    return Action.GIVE_UP


@dataclass(frozen=True)
class CohortView:
    """What the job's store says about one running elastic worker process."""

    worker_id: str | None
    """Its member id (None: it has not joined, or its script does not use the cohort)."""
    left_out: bool = False
    """A generation it belonged to went on without it."""
    left: bool = False
    """It announced leaving (or its agent saw it exit): its own way out."""
    admitted: bool = False


def why_end(view: CohortView, *, finished_for: float | None, grace: float) -> str | None:
    """Why the agent must end this still-running worker now (None: let it run).

    A member left out without leaving stopped heartbeating (frozen by SIGSTOP, or cut
    off): the cohort replaced its state, and it would exit when it noticed, if it ever
    runs again. A joiner still waiting ``grace`` s after the run finished would exit as
    well, if it could run. ``finished_for``: seconds since the run finished, or None."""
    if view.worker_id is not None and view.left_out and not view.left:
        return ("the cohort went on without it (it stopped taking part: frozen, e.g. by "
                "SIGSTOP, hung in its script past the collectives' timeout, or cut off from "
                "the store), so its agent ended it")
    if finished_for is not None and finished_for > grace and view.worker_id is not None \
            and not view.admitted:
        return (f"the run finished {finished_for:.0f} s ago while it was still waiting to "
                "be admitted, so its agent ended it")
    return None


@dataclass(frozen=True)
class RollCall:
    """The agents on an elastic job's roll that have not checked out yet."""

    waiting: tuple[int, ...]
    """Still beating (or not yet beating): node 0 keeps the store up for them."""
    lost: tuple[int, ...]
    """Their heartbeat stopped: killed or cut off; nobody waits for them."""


def roll_call(pending: list[int], beats: dict[int, float], *, now: float,
              timeout: float) -> RollCall:
    """Split the agents that did not check out (``pending``) by when their beat last
    changed (seconds on the caller's clock, as ``now``; absent: it checked in and has
    not beaten yet). An agent beats from its check-in to its check-out, so one whose
    beat has not changed for ``timeout`` is gone."""
    lost = tuple(a for a in pending if a in beats and now - beats[a] > timeout)
    return RollCall(tuple(a for a in pending if a not in lost), lost)


# A worker that ended so is out of the cohort for good: the cohort's trust checks put it
# out, or refused its seat at admission for that, or its side of a split cohort is not
# a majority (the other side goes on without it). A restart would only be refused again.
BANNED = ("QuarantinedError", "SeatBannedError", "NoQuorumError")


def not_to_restart(error: ErrorRecordLike | None) -> bool:
    """Whether a dead worker's recorded error forbids restarting it (``BANNED``)."""
    return error is not None and error.exc_type in BANNED
