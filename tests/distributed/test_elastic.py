"""Lose a worker mid-run, lose nothing: 3 workers, one SIGKILLed, 2 finish the run.

The store lives in the test process (as it lives in the launcher's agent), so no
worker's death takes it along. Every step trains on the same global batch whatever the
membership (equal shares, mean of per-sample losses), so the elastic run must equal one
process training on the global batches, up to floating-point summation order (float64:
1e-9 relative). The redone step is trained once: the ledger of committed samples holds
every index of every epoch exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from potluck.harness.elastic_job import (
    ElasticJob,
    ledger_problems,
    params,
    single_process,
    start_worker,
    train,
)
from potluck.harness.ranks import free_port, run_ranks

EPOCHS, KILL_AT = 2, 3
COLLECTIVE_TIMEOUT = 4.0  # a frozen peer is given up on after this long
JOB = ElasticJob(epochs=EPOCHS, collective_timeout=COLLECTIVE_TIMEOUT)


def assert_exactly_once(ledger_dir: Path, job: ElasticJob, context: str = "") -> None:
    """Every sample of every epoch in the committed-sample ledgers exactly once."""
    problems = ledger_problems(ledger_dir, job)
    assert not problems, f"{context} not exactly once: {problems}"


def _elastic(rank: int, world_size: int, port: int, victim: int,
             ledger_dir: str, fault: str = "kill", job: ElasticJob = JOB) -> dict[str, Any]:
    worker = start_worker(job, f"worker-{rank}", "127.0.0.1", port)

    def inject(steps: int) -> None:
        if steps == KILL_AT and rank == victim:
            os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)

    # The ledger is flushed after every committed step: it outlives a SIGKILL.
    return train(worker, job, Path(ledger_dir, f"rank{rank}.jsonl"), inject)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_lost_worker_survivors_redo_the_step_and_finish(tmp_path: Path, fault: str) -> None:
    from torch.distributed import TCPStore

    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=30))
    results = run_ranks(_elastic, 3, port, 2, str(tmp_path), fault, init_group=False,
                        may_die={2}, timeout=100)
    assert results[2] is None  # the victim died
    survivors = results[:2]
    expected = single_process(JOB)
    for result in survivors:
        assert result["world_size"] == 2 and result["generation"] == 1
        assert result["redone"] == 1
        for name, value in expected.items():
            torch.testing.assert_close(result["params"][name], value, rtol=1e-9, atol=1e-12)
        # Recovery: the rendezvous waits for the lost worker's heartbeat to go stale
        # (1.5 s); a frozen peer is first noticed at the collective timeout.
        assert result["events"][0]["recovery_s"] < 5
        assert result["detected_s"] < (COLLECTIVE_TIMEOUT + 3 if fault == "stop" else 3)
    assert_exactly_once(tmp_path, JOB)
    del store  # the store outlives every worker, as the launcher's agent's does


@pytest.mark.timeout(120)
def test_a_lone_survivor_trains_on_alone(tmp_path: Path) -> None:
    """2 workers, one killed: the survivor's generation has one member, whose backward
    never communicates; its steps must still be applied (the failure belonged to the
    previous generation)."""
    from torch.distributed import TCPStore

    job = replace(JOB, expected=2)
    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=30))
    results = run_ranks(_elastic, 2, port, 1, str(tmp_path), "kill", job, init_group=False,
                        may_die={1}, timeout=100)
    survivor = results[0]
    assert results[1] is None and survivor["world_size"] == 1 and survivor["redone"] == 1
    for name, value in single_process(job).items():
        torch.testing.assert_close(survivor["params"][name], value, rtol=1e-9, atol=1e-12)
    assert_exactly_once(tmp_path, job)
    del store


def _join_leave(rank: int, world_size: int, port: int, ledger_dir: str) -> dict[str, Any]:
    # rank 2 is a late worker: the cohort is already training when it joins
    worker = start_worker(JOIN_JOB, f"worker-{rank}", "127.0.0.1", port,
                          before_join=(lambda: time.sleep(1.5)) if rank == 2 else None)
    cohort, model, cursor, opt = worker.cohort, worker.model, worker.cursor, worker.optimizer
    opt.leave_on_sigterm()
    sizes, asked = [], False
    with Path(ledger_dir, f"rank{rank}.jsonl").open("a") as ledger:
        while cursor.epoch < JOIN_JOB.epochs and not opt.left:
            for index, x, y in worker.loader:
                time.sleep(0.15)  # stand-in for real compute, so the joiner arrives mid-run
                if rank == 1 and cohort.world_size == 3 and opt.steps >= 14 and not asked:
                    os.kill(os.getpid(), signal.SIGTERM)  # the owner wants the GPU back
                    asked = True
                epoch = cursor.epoch
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                if opt.step().committed:
                    ledger.write(json.dumps([epoch, index.tolist()]) + "\n")
                    ledger.flush()
                    sizes.append(cohort.world_size)
    cohort.close()
    return {"params": params(model.module), "left": opt.left, "sizes": sizes,
            "events": cohort.events, "joined_late": cohort.joined_late}


JOIN_JOB = replace(JOB, epochs=6, expected=2, collective_timeout=20.0)


@pytest.mark.timeout(150)
def test_worker_joins_with_live_state_and_another_leaves_gracefully(tmp_path: Path) -> None:
    from torch.distributed import TCPStore

    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=30))
    founder, leaver, joiner = run_ranks(_join_leave, 3, port, str(tmp_path),
                                        init_group=False, timeout=130)
    assert joiner["joined_late"] and not founder["joined_late"]
    assert leaver["left"] and not founder["left"] and not joiner["left"]
    assert 3 in founder["sizes"] and founder["sizes"][-1] == 2  # grew to 3, shrank to 2
    left = [e for e in founder["events"] if e["left"]]
    assert left and left[0]["recovery_s"] < 1.5, "a graceful leave needs no timeout"
    expected = single_process(JOIN_JOB)
    for result in (founder, joiner):
        for name, value in expected.items():
            torch.testing.assert_close(result["params"][name], value, rtol=1e-9, atol=1e-12)
    assert_exactly_once(tmp_path, JOIN_JOB)
    del store
