"""A healthy population at run time: swap a member that drags the cohort down for a
waiting spare, at a step boundary (``potluck run --elastic --cohort-size N
--swap-drag F``).

``swap`` (the rule and its decision: pure), ``probe`` (a member's link, through the
store), ``part`` (``SwapPart``: the step part that checks and names who leaves).
"""

from potluck.population.part import SwapPart
from potluck.population.probe import LinkProbe, StoreProbe
from potluck.population.swap import SwapDecision, SwapRule

__all__ = ["LinkProbe", "StoreProbe", "SwapDecision", "SwapPart", "SwapRule"]
