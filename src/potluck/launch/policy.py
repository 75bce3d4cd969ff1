"""What to do after one attempt of the local worker set: finish, restart, or give up.

Pure, so restarts are tested without processes. Today a failure restarts the whole
local worker set; elastic rejoin (restart only the dead worker) changes this function.
"""

from __future__ import annotations

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
