"""What to do after one attempt of the local worker set (finish, restart, or give up),
and when an elastic agent ends a worker that is still running (``why_end``).

Pure, so both are tested without processes or a store.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Outcome(Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"  # elastic: the cohort checkpointed and stopped below its minimum


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
