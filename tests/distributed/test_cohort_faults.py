"""A dead peer (SIGKILL) or a frozen one (SIGSTOP) is a PeerLostError on every survivor.

Ranks are separate processes on real Gloo, joined with ``potluck.init``; the test hosts
the TCPStore like the launcher's agent does, so the victim's death does not take the
store with it. Each rank all-reduces until a peer is lost; the victim is killed or
frozen at step 20 (``potluck.testing.Faults``).
"""

from __future__ import annotations

import itertools
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch._C._distributed_c10d import TCPStore

from potluck.testing import Faults, run_ranks

WORLD_SIZE = 3
VICTIM, AT = WORLD_SIZE - 1, 20


def _rank(rank: int, world_size: int, port: int, timeout: float,
          faults: Faults) -> dict[str, Any]:
    import potluck
    from potluck.env import WorkerEnv

    env = WorkerEnv(rank=rank, world_size=world_size, local_world_size=world_size,
                    master_addr="127.0.0.1", master_port=port, agent_store=True,
                    run_id="faults")
    cohort = potluck.init(timeout=timeout, env=env)
    inject = faults.injector(rank)
    last_ok = time.monotonic()
    try:
        for step in itertools.count():
            inject(step)
            cohort.all_reduce_sum(torch.ones(1000))
            last_ok = time.monotonic()
            time.sleep(0.01)
    except potluck.PeerLostError as exc:
        return {"waited": time.monotonic() - last_ok, "rank": exc.rank,
                "generation": exc.generation}
    finally:
        cohort.close()  # a clean exit: the retired group is already torn down
    raise AssertionError("unreachable")


def _survivors(faults: Faults, timeout: float) -> list[dict[str, Any]]:
    store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                     wait_for_workers=False)
    try:
        results = run_ranks(_rank, WORLD_SIZE, store.port, timeout, faults, init_group=False,
                            may_die=faults.may_die, timeout=50)
    finally:
        del store
    assert results[VICTIM] is None
    for rank, report in enumerate(results[:VICTIM]):
        assert report["rank"] == rank and report["generation"] == 0
    return results[:VICTIM]


@pytest.mark.timeout(60)
def test_killed_peer_fails_every_survivor_at_once() -> None:
    for report in _survivors(Faults().kill(VICTIM, AT), timeout=30.0):
        assert report["waited"] < 5.0, report  # at once: far below the 30 s timeout


@pytest.mark.timeout(60)
def test_frozen_peer_fails_every_survivor_at_the_timeout() -> None:
    for report in _survivors(Faults().freeze(VICTIM, AT), timeout=3.0):
        assert 2.0 < report["waited"] < 8.0, report  # the 3 s timeout, not a hang nor at once
