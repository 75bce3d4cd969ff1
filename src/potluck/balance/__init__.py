"""Uneven workers: shares of each step by measured speed, the average still exact.

``speed`` (smoothed samples/s and their noise), ``planner`` (speeds in, per-rank counts
out, and when to move to them: pure),
``clock`` (this rank's compute time per step), ``balancer`` (the share policy that
ties them to the step transaction).
"""

from potluck.balance.balancer import BalanceConfig, Balancer
from potluck.balance.planner import Plan, plan_shares, replan
from potluck.balance.speed import SpeedMeter

__all__ = ["BalanceConfig", "Balancer", "Plan", "SpeedMeter", "plan_shares",
           "replan"]
