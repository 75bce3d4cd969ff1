"""``potluck run``: start, watch, restart and stop a node's workers; host the store."""

from potluck.launch.config import LaunchConfig, worker_environ
from potluck.launch.policy import Action, Outcome, next_action

__all__ = ["Action", "LaunchConfig", "Outcome", "next_action", "worker_environ"]
