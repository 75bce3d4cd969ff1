"""Candidates grouped by latency (pure): machines within ``close_s`` of one another,
directly or through a chain of close ones, form a group (single linkage).

A ring that syncs every step waits on its longest hop ``2 (N - 1)`` times a step, so
the planner draws an every-step cohort from one group. A round-based cohort syncs
once in H steps and may span groups.
"""

from __future__ import annotations

from collections.abc import Sequence

from potluck.plan.machines import Machine
from potluck.plan.ring import NEAR, Distances, latency

# One-way seconds under which two machines count as close: a metro area, or one cloud
# region's zones.
CLOSE_S = 0.010


def latency_groups(machines: Sequence[Machine], distances: Distances = NEAR,
                   close_s: float = CLOSE_S) -> list[list[Machine]]:
    """The groups, each in the candidates' order, the group of the first one first."""
    group_of = list(range(len(machines)))

    def root(i: int) -> int:
        while group_of[i] != i:
            group_of[i] = group_of[group_of[i]]
            i = group_of[i]
        return i

    for i, a in enumerate(machines):
        for j in range(i + 1, len(machines)):
            if latency(a, machines[j], distances) <= close_s:
                group_of[root(j)] = root(i)
    groups: dict[int, list[Machine]] = {}
    for i, machine in enumerate(machines):
        groups.setdefault(root(i), []).append(machine)
    return list(groups.values())


def nearest_s(machine: Machine, cohort: Sequence[Machine],
              distances: Distances = NEAR) -> float:
    """One-way seconds from ``machine`` to the closest member of ``cohort``."""
    return min((latency(machine, m, distances) for m in cohort if m is not machine),
               default=0.0)
