"""The cohort: this worker's group right now (generation, rank, world size, group handle).

``init()`` joins the job the launcher started (fixed or elastic); ``Cohort`` is the one
class for both; ``GroupHandle`` is the stable handle every holder talks through.
"""

from potluck.cohort.cohort import Cohort
from potluck.cohort.groups import GroupSpec
from potluck.cohort.init import init, join_elastic
from potluck.group import GroupHandle, ProcessGroupLike, as_handle

__all__ = ["Cohort", "GroupHandle", "GroupSpec", "ProcessGroupLike", "as_handle", "init",
           "join_elastic"]
