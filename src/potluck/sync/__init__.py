"""Sync strategies: how replicas are reconciled when not every step (DiLoCo, Local SGD).

``config.py`` (``DiLoCo``, ``LocalSGD``, ``StreamingDiLoCo``: what a user passes to
``prepare(sync=...)``), ``round_plan.py`` (pure: local steps per rank by speed, the
weight of a pseudo-gradient, when each fragment is sent, what a lost member took),
``fragments.py`` (the outer step and merge of one fragment), ``round_sum.py`` (the seam
that combines the members' pseudo-gradients), ``diloco.py``
(``DiLoCoSync``, the step transaction's part).
"""

from potluck.sync.config import DiLoCo, LocalSGD, StreamingDiLoCo
from potluck.sync.diloco import DiLoCoSync, RoundRecord
from potluck.sync.round_plan import local_steps, lost_ranges, plan_round, weight
from potluck.sync.round_sum import CodecSum, Piece, RoundSum

__all__ = ["CodecSum", "DiLoCo", "DiLoCoSync", "LocalSGD", "Piece", "RoundRecord", "RoundSum",
           "local_steps", "lost_ranges", "plan_round", "StreamingDiLoCo", "weight"]
