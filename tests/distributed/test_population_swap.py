"""``SwapPart`` in a cohort on loopback: a slowed member is swapped for a waiting spare.

Three workers found an elastic cohort of wanted size 3 (``max_size``); a fourth joins
once it formed and waits as a spare. Rank 1's forward sleeps, so its compute drags every
step. The members' checks (``potluck run --swap-drag 0.3 --swap-window 4``) blame it:
it leaves at a step boundary as in a planned leave, the spare comes in with the live
state, and every sample is trained exactly once. One swap only: each member's part
decided it once, the spare decided nothing.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from potluck.testing import SampleLedger, assert_exactly_once, free_port, run_ranks
from potluck_lab.elastic_job import ElasticJob, Indexed
from potluck_lab.models import tiny_mlp

JOB = ElasticJob(samples=96, global_batch=12, epochs=2, expected=3,
                 collective_timeout=30.0)
FORMED, QUEUED = "test/formed", "test/spare-queued"
SLOW_S = 0.1  # rank 1's forward, each step


def _worker(rank: int, world_size: int, port: int, ledger_dir: str) -> dict[str, Any]:
    from potluck import prepare
    from potluck.cohort import GroupSpec, join_elastic
    from potluck.env import WorkerEnv
    from potluck.population import SwapPart
    from potluck.rendezvous import RendezvousConfig

    net = tiny_mlp()
    if rank == 1:
        net.register_forward_pre_hook(lambda *_: time.sleep(SLOW_S))
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=False,
                                       timeout=timedelta(seconds=60))
    if rank == 3:  # the spare: once the cohort formed, so it cannot be a founder
        store.wait([FORMED], timedelta(seconds=60))
    config = RendezvousConfig(token=JOB.token, expected=JOB.expected, max_size=3,
                              heartbeat_interval=0.2, heartbeat_timeout=3.0,
                              settle_timeout=10.0, join_timeout=90.0)
    env = WorkerEnv(elastic=True, cohort_size=3, swap_drag=0.3, swap_window=4)
    cohort = join_elastic(store, f"worker-{rank}", config,
                          GroupSpec("gloo", JOB.collective_timeout, "127.0.0.1"), env=env)
    model, opt, loader = prepare(net, sgd, Indexed(JOB.samples), cohort=cohort,
                                 global_batch=JOB.global_batch, seed=JOB.data_seed)
    if rank == 0:
        store.set(FORMED, "1")
        deadline = time.monotonic() + 60
        while cohort.spares() < 1:  # the spare waits before the first check
            assert time.monotonic() < deadline, "the spare never queued"
            time.sleep(0.02)
        store.set(QUEUED, "1")
    if rank < 3:
        store.wait([QUEUED], timedelta(seconds=60))
    swap = next(p for p in opt.parts if isinstance(p, SwapPart))
    sizes = []
    with SampleLedger(Path(ledger_dir, f"rank{rank}.jsonl")) as ledger:
        while opt.cursor.epoch < JOB.epochs and not opt.left:
            for index, x, y in loader:
                epoch = opt.cursor.epoch
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                if opt.step().committed:
                    ledger.record(epoch, index.tolist())
                    sizes.append(cohort.world_size)
    finished = opt.finish()
    cohort.close()
    return {"worker": f"worker-{rank}", "left": opt.left, "finished": finished,
            "late": cohort.joined_late, "sizes": sizes, "steps": opt.steps,
            "decisions": [(d.member, d.step) for d in swap.decisions]}


@pytest.mark.timeout(150)
def test_a_slowed_member_is_swapped_for_the_waiting_spare_once(tmp_path: Path) -> None:
    port = free_port()
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True,
                                       wait_for_workers=False, timeout=timedelta(seconds=60))
    try:
        results = run_ranks(_worker, 4, port, str(tmp_path), init_group=False,
                            timeout=130)
    finally:
        del store
    founder, slow, other, spare = results
    assert slow["left"] and not slow["finished"]
    assert spare["late"] and spare["finished"] and not spare["left"]
    assert founder["finished"] and other["finished"]
    swapped_at = slow["steps"]
    # Every founder decided the same swap once; the spare, protected, decided none.
    for member in (founder, slow, other):
        assert member["decisions"] == [("worker-1", swapped_at)], member["decisions"]
    assert spare["decisions"] == []
    assert swapped_at <= 2 * 4, "the swap came later than two windows of steps"
    total = JOB.epochs * JOB.samples // JOB.global_batch
    assert founder["steps"] == total and len(founder["sizes"]) == total
    assert set(founder["sizes"]) == {3}  # the spare came in as the member left
    assert len(spare["sizes"]) == total - swapped_at
    assert_exactly_once(tmp_path, JOB.samples, JOB.epochs)
