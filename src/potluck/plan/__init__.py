"""The planner: predict a cohort's throughput per sync mode, and choose its members.

``predict`` prices one cohort in one mode (``predict.py``, on the ring all-reduce's
cost in ``ring.py`` and potluck's own round plans); ``choose`` picks the cohort
(``select.py``) and ``left_out`` says why the others were not taken (``reasons.py``).
Everything here is pure; ``potluck plan`` (``cli.py``) reads a candidates file and
the reputation record, and ``calibrate.py`` measures what the file leaves out.
"""

from potluck.plan.groups import latency_groups
from potluck.plan.machines import Machine, Overheads, Workload
from potluck.plan.modes import SyncMode, default_modes, diloco, every_step, streaming
from potluck.plan.predict import Prediction, predict
from potluck.plan.reasons import left_out
from potluck.plan.ring import Distances, allreduce_s
from potluck.plan.select import Choice, Risk, Search, choose, expected

__all__ = ["Choice", "Distances", "Machine", "Overheads", "Prediction", "Risk", "Search",
           "SyncMode", "Workload", "allreduce_s", "choose", "default_modes", "diloco",
           "every_step", "expected", "latency_groups", "left_out", "predict", "streaming"]
