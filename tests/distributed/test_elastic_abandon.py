"""A member waiting in a collective for a peer that already gave up on the step is
released at once (the peer's mark in the store), not after the collective timeout."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import torch

from potluck.testing import free_port, run_ranks
from potluck_lab.models import tiny_mlp

COLLECTIVE_TIMEOUT = 20.0


def _worker(rank: int, world_size: int, port: int) -> dict[str, Any]:
    from potluck import DataParallel
    from potluck.cohort import GroupSpec, join_elastic
    from potluck.rendezvous import RendezvousConfig

    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=False,
                                       timeout=timedelta(seconds=30))
    config = RendezvousConfig(token="t", expected=2, heartbeat_interval=0.2,
                              heartbeat_timeout=1.5, settle_timeout=10.0)
    cohort = join_elastic(store, f"w{rank}", config,
                          GroupSpec("gloo", COLLECTIVE_TIMEOUT, "127.0.0.1"))
    # The model holds the cohort's handle, which knows when a peer gave up (no wiring).
    model = DataParallel(tiny_mlp(), group=cohort.group, on_failure="abandon")
    waited = None
    if rank == 1:  # gives up on the step before sending anything, but stays alive
        time.sleep(0.5)
        cohort.mark_step_failed()
    else:
        started = time.monotonic()
        model(torch.randn(4, 8, dtype=torch.float64)).sum().backward()
        waited = time.monotonic() - started
    failed = rank == 1 or model.step_failed
    membership = cohort.recover("a member abandoned the step")
    cohort.close()
    return {"waited": waited, "failed": failed, "generation": membership.generation,
            "world_size": membership.world_size}


@pytest.mark.timeout(60)
def test_a_member_waiting_on_a_peer_that_gave_up_is_released_at_once() -> None:
    port = free_port()
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True,
                                       wait_for_workers=False, timeout=timedelta(seconds=30))
    try:
        results = run_ranks(_worker, 2, port, init_group=False, timeout=50)
    finally:
        del store
    assert results[0]["failed"]
    assert results[0]["waited"] < 3.0 < COLLECTIVE_TIMEOUT  # released by the mark
    assert [(r["generation"], r["world_size"]) for r in results] == [(1, 2), (1, 2)]
