"""An admitted joiner that is slow to take the live state does not break the cohort.

Between joining (``join_elastic``) and receiving the state (``prepare``) a
joiner runs its own setup, which may take longer than the collective timeout (a first
optimizer's imports take seconds). The members wait for it up to ``STATE_TIMEOUT``
instead; the run then equals one process (float64, 1e-9) with every sample once.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from potluck.testing import (
    SampleLedger,
    assert_exactly_once,
    assert_replicas_equal,
    free_port,
    run_ranks,
)
from potluck_lab.elastic_job import (
    ElasticJob,
    Indexed,
    params,
    single_process,
    wait_for_joiner,
)
from potluck_lab.models import tiny_mlp
from tests.distributed.late_join import TRAINING_KEY, join_after_founders

JOB = ElasticJob(epochs=3, expected=2, collective_timeout=1.5)
SETUP_S = 4.0  # the joiner's setup after joining: well past the collective timeout


def _worker(rank: int, world_size: int, port: int, ledger_dir: str) -> dict[str, Any]:
    from potluck import prepare

    net = tiny_mlp()
    store, cohort = join_after_founders(rank, port, JOB)
    if cohort.joined_late:
        time.sleep(SETUP_S)  # slow setup while the members wait to send the state
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    model, opt, loader = prepare(net, sgd, Indexed(JOB.samples), cohort=cohort,
                                 global_batch=JOB.global_batch, seed=JOB.data_seed)
    cursor = opt.cursor
    with SampleLedger(Path(ledger_dir, f"rank{rank}.jsonl")) as ledger:
        while cursor.epoch < JOB.epochs:
            for index, x, y in loader:
                if rank == 0 and opt.steps == 1:
                    store.set(TRAINING_KEY, "1")
                if not cohort.joined_late and opt.steps == 3 and cohort.world_size == 2:
                    wait_for_joiner(cohort)  # admitted mid-run however slow the machine
                epoch = cursor.epoch
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                if opt.step().committed:
                    ledger.record(epoch, index.tolist())
    opt.finish()
    return {"params": params(model.module), "world_size": cohort.world_size,
            "redone": opt.redone, "pid": os.getpid(), "late": cohort.joined_late}


@pytest.mark.timeout(120)
def test_a_slow_joiner_is_waited_for_not_dropped(tmp_path: Path) -> None:
    port = free_port()
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True,
                                       wait_for_workers=False, timeout=timedelta(seconds=30))
    results = run_ranks(_worker, 3, port, str(tmp_path), init_group=False, timeout=100)
    assert results[2]["late"]
    for result in results:
        assert result["world_size"] == 3 and result["redone"] == 0
    assert_replicas_equal([r["params"] for r in results], reference=single_process(JOB),
                          rtol=1e-9, atol=1e-12)
    assert_exactly_once(tmp_path, JOB.samples, JOB.epochs)
    del store
