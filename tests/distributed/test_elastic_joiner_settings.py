"""A joiner whose ``prepare`` settings differ from the cohort's is refused by name.

The founders agree on their settings in ``prepare`` (one all-gather); a joiner takes no
part in that, so it compares its own with the ones the live state carries. One with
another ``clip_grad_norm`` (or trust, sync, balance, DataParallel option) raises a
``ConfigError`` naming the setting, both values and the fix, and leaves; the founders
go on without it and still train every sample once, as one process would.
"""

from __future__ import annotations

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
from potluck_lab.elastic_job import ElasticJob, Indexed, params, single_process
from potluck_lab.models import tiny_mlp
from tests.distributed.late_join import TRAINING_KEY, join_after_founders

JOB = ElasticJob(epochs=3, expected=2, collective_timeout=1.5)
REFUSED_KEY = "test/joiner_refused"


def _worker(rank: int, world_size: int, port: int, ledger_dir: str) -> dict[str, Any]:
    from potluck import prepare
    from potluck.errors import ConfigError

    net = tiny_mlp()
    store, cohort = join_after_founders(rank, port, JOB)
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    try:
        model, opt, loader = prepare(net, sgd, Indexed(JOB.samples), cohort=cohort,
                                     global_batch=JOB.global_batch, seed=JOB.data_seed,
                                     clip_grad_norm=5.0 if rank == 2 else None)
    except ConfigError as exc:
        store.set(REFUSED_KEY, "1")
        cohort.close()
        return {"refused": str(exc), "late": cohort.joined_late}
    cursor = opt.cursor
    with SampleLedger(Path(ledger_dir, f"rank{rank}.jsonl")) as ledger:
        while cursor.epoch < JOB.epochs:
            for index, x, y in loader:
                if rank == 0 and opt.steps == 1:
                    store.set(TRAINING_KEY, "1")
                if opt.steps == 3:  # the joiner is refused mid-run however slow the machine:
                    _await_queued(cohort, store)  # queued, the next boundary admits it
                if opt.steps == 4:
                    store.wait([REFUSED_KEY], timedelta(seconds=60))
                epoch = cursor.epoch
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                if opt.step().committed:
                    ledger.record(epoch, index.tolist())
    opt.finish()
    return {"params": params(model.module), "world_size": cohort.world_size,
            "refused": None, "late": cohort.joined_late}


def _await_queued(cohort: Any, store: torch.distributed.TCPStore) -> None:
    """Wait until the joiner waits to be admitted (or was admitted and refused). Only a
    step boundary admits: waiting for the refusal before the joiner was queued would
    hold every boundary back, and a joiner that started slowly would wait its
    join_timeout, never admitted (seen once on a loaded machine)."""
    deadline = time.monotonic() + 60
    while not (cohort.pending_joiners() or store.check([REFUSED_KEY])):
        assert time.monotonic() < deadline, "the joiner never asked to join"
        time.sleep(0.01)


@pytest.mark.timeout(120)
def test_a_joiner_with_other_settings_is_refused_and_the_cohort_goes_on(
        tmp_path: Path) -> None:
    port = free_port()
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True,
                                       wait_for_workers=False, timeout=timedelta(seconds=30))
    results = run_ranks(_worker, 3, port, str(tmp_path), init_group=False, timeout=100)
    refused = results[2]["refused"]
    assert results[2]["late"] and refused is not None
    assert "clip_grad_norm: the cohort's None, this worker's 5" in refused, refused
    assert "same script and arguments" in refused
    for result in results[:2]:
        assert result["refused"] is None and result["world_size"] == 2
    assert_replicas_equal([r["params"] for r in results[:2]], reference=single_process(JOB),
                          rtol=1e-9, atol=1e-12)
    assert_exactly_once(tmp_path, JOB.samples, JOB.epochs)
    del store
