"""The cohort: this worker's group right now (generation, rank, world size, group)."""

from potluck.cohort.cohort import Cohort, init
from potluck.cohort.groups import wait_collective

__all__ = ["Cohort", "init", "wait_collective"]
