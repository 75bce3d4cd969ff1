"""A joiner whose live state does not arrive goes back to the join queue.

A member dies as the state's broadcast to an admitted joiner begins: the sender (rank 0),
or another member. The members recover without the dead one. The joiner either took the
state (then it recovers with them, by the step's path) or did not (then it leaves that
generation, joins again under a new id and is admitted at a later boundary). Either way
it ends in the cohort, the run equals one process (float64, 1e-9) and every sample is
trained exactly once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from potluck.testing import (
    SampleLedger,
    assert_exactly_once,
    assert_replicas_equal,
    hosted_store,
    run_ranks,
)
from potluck_lab.elastic_job import ElasticJob, Indexed, params, single_process, wait_for_joiner
from potluck_lab.models import tiny_mlp
from tests.distributed.late_join import TRAINING_KEY, join_after_founders

JOB = ElasticJob(samples=96, epochs=2, expected=3, collective_timeout=10.0)
JOINER = 3
REJOINED = "the live state did not arrive"  # the joiner's event when it rejoined


def _worker(rank: int, world_size: int, port: int, ledger_dir: str,
            dying: int) -> dict[str, Any]:
    from potluck import prepare
    from potluck.step.live_state import LiveState

    net = tiny_mlp()
    store, cohort = join_after_founders(rank, port, JOB, joiner=JOINER)
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    model, opt, loader = prepare(net, sgd, Indexed(JOB.samples), cohort=cohort,
                                 global_batch=JOB.global_batch, seed=JOB.data_seed)
    cursor = opt.cursor
    step: list[tuple[int, list[int]]] = []  # the step under way: (epoch, samples)

    def die(*_: Any) -> None:
        """As the live state's broadcast begins: no goodbye, no leave key. The step
        before the boundary committed on every member: its samples reached the model."""
        ledger.record(*step[-1])
        os._exit(1)

    with SampleLedger(Path(ledger_dir, f"rank{rank}.jsonl")) as ledger:
        if rank == dying:  # (this process only)
            LiveState.send = die  # type: ignore[method-assign]
        while cursor.epoch < JOB.epochs:
            for index, x, y in loader:
                if rank == 0 and opt.steps == 1:
                    store.set(TRAINING_KEY, "1")
                if not cohort.joined_late and cohort.world_size == 3 and opt.steps == 2:
                    wait_for_joiner(cohort)  # the first admission: then a member dies
                if not cohort.joined_late and cohort.world_size == 2:
                    wait_for_joiner(cohort)  # the joiner's return, however slow
                epoch = cursor.epoch
                step.append((epoch, index.tolist()))
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                if opt.step().committed:
                    ledger.record(epoch, index.tolist())
    opt.finish()
    causes = [event["cause"] for event in cohort.events]
    return {"params": params(model.module), "world_size": cohort.world_size,
            "late": cohort.joined_late, "rejoined": REJOINED in causes,
            "worker_id": cohort.worker_id}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("dying", [0, 1])
def test_a_joiner_whose_state_broadcast_loses_a_member_ends_in_the_cohort(
        tmp_path: Path, dying: int) -> None:
    with hosted_store(30.0) as (port, _):
        results = run_ranks(_worker, 4, port, str(tmp_path), dying, init_group=False,
                            timeout=130, may_die=(dying,))
    assert results[dying] is None
    finishers = [r for rank, r in enumerate(results) if rank != dying]
    joiner = results[JOINER]
    assert joiner["late"]
    if dying == 0:  # the sender died: the state cannot have arrived
        assert joiner["rejoined"] and joiner["worker_id"] == f"worker-{JOINER}.1"
    for result in finishers:
        assert result["world_size"] == 3, result
    assert_replicas_equal([r["params"] for r in finishers], reference=single_process(JOB),
                          rtol=1e-9, atol=1e-12)
    assert_exactly_once(tmp_path, JOB.samples, JOB.epochs)
