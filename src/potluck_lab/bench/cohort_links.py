"""The cohort's machines before a contender runs, and the bytes each link carried.

Both contenders of ``potluck bench cohort`` start alike: every host's port on the switch
up (the last contender's run cut the store's host), each host's link capped at its rate
(``LINKS_MBIT``, both ways), every CPU quota lifted until the run's first commit sets
it, and each link's byte counters read, so what the run sent is the difference.
"""

from __future__ import annotations

from collections.abc import Sequence

from potluck_lab.bench.cohort_plan import LINKS_MBIT
from potluck_lab.machine.cpu_quota import CpuQuota
from potluck_lab.machine.netns import BridgedHosts

Counters = list[tuple[int, int]]  # per host: bytes sent, bytes received


def shape(hosts: BridgedHosts, quotas: Sequence[CpuQuota]) -> Counters:
    """Mend and cap the links, lift the quotas; each link's byte counters now."""
    for host, mbit in enumerate(LINKS_MBIT):
        hosts.mend(host)
        hosts.limit(f"{mbit:g}mbit", [host])
    for quota in quotas:
        quota.set(None)
    return [hosts.link_bytes(h) for h in range(len(LINKS_MBIT))]


def carried(hosts: BridgedHosts, before: Counters) -> Counters:
    """What each link sent and received since ``before``."""
    return [(sent - was_sent, received - was_received)
            for (sent, received), (was_sent, was_received)
            in zip((hosts.link_bytes(h) for h in range(len(before))), before, strict=True)]
