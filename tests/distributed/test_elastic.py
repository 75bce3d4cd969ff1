"""Lose a worker mid-run, lose nothing: 3 workers, one SIGKILLed, 2 finish the run.

The store lives in the test process (as it lives in the launcher's agent), so no
worker's death takes it along. Every step trains on the same global batch whatever the
membership (equal shares, mean of per-sample losses), so the elastic run must equal one
process training on the global batches, up to floating-point summation order (float64:
1e-9 relative). The redone step is trained once: the ledger of committed samples holds
every index of every epoch exactly once.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from potluck.testing import (
    Faults,
    SampleLedger,
    assert_exactly_once,
    assert_replicas_equal,
    free_port,
    run_ranks,
)
from potluck_lab.elastic_job import (
    ElasticJob,
    params,
    single_process,
    start_worker,
    train,
    wait_for_joiner,
)
from tests.distributed.late_join import TRAINING_KEY

EPOCHS, KILL_AT = 2, 3
COLLECTIVE_TIMEOUT = 4.0  # a frozen peer is given up on after this long
JOB = ElasticJob(epochs=EPOCHS, collective_timeout=COLLECTIVE_TIMEOUT)
EXACT = {"rtol": 1e-9, "atol": 1e-12}  # float64: only the summation order differs


def _elastic(rank: int, world_size: int, port: int, faults: Faults, ledger_dir: str,
             job: ElasticJob = JOB) -> dict[str, Any]:
    worker = start_worker(job, f"worker-{rank}", "127.0.0.1", port)
    inject = faults.injector(rank, group=worker.cohort.group)
    # The ledger is flushed after every committed step: it outlives a SIGKILL.
    return train(worker, job, Path(ledger_dir, f"rank{rank}.jsonl"), inject)


def _run(faults: Faults, world_size: int, ledger_dir: Path,
         job: ElasticJob = JOB) -> list[Any]:
    """``world_size`` workers of ``job`` under ``faults``, on a store of this process's
    (as the launcher's agent hosts it, it outlives every worker)."""
    from torch.distributed import TCPStore

    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=30))
    try:
        return run_ranks(_elastic, world_size, port, faults, str(ledger_dir), job,
                         init_group=False, may_die=faults.may_die, timeout=100)
    finally:
        del store


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["kill", "freeze"])
def test_lost_worker_survivors_redo_the_step_and_finish(tmp_path: Path, fault: str) -> None:
    faults = Faults().kill(2, KILL_AT) if fault == "kill" else Faults().freeze(2, KILL_AT)
    results = _run(faults, 3, tmp_path)
    assert results[2] is None  # the victim died
    survivors = results[:2]
    for result in survivors:
        assert result["world_size"] == 2 and result["generation"] == 1
        assert result["redone"] == 1
        # Recovery: the rendezvous waits for the lost worker's heartbeat to go stale
        # (1.5 s); a frozen peer is first noticed at the collective timeout.
        assert result["events"][0]["recovery_s"] < 5
        assert result["detected_s"] < (COLLECTIVE_TIMEOUT + 3 if fault == "freeze" else 3)
    assert_replicas_equal([r["params"] for r in survivors], reference=single_process(JOB),
                          **EXACT)
    assert_exactly_once(tmp_path, JOB.samples, JOB.epochs)


@pytest.mark.timeout(120)
def test_a_failed_collective_is_redone_by_every_member(tmp_path: Path) -> None:
    """Rank 1's collective fails at step 3 and nobody is lost: every member gives up on
    the step (rank 1's mark on the store), the next generation has all three, and the
    step is trained once."""
    results = _run(Faults().fail_collective(1, KILL_AT), 3, tmp_path)
    for result in results:
        assert result["world_size"] == 3 and result["generation"] == 1
        assert result["redone"] == 1
        assert result["detected_s"] < 3  # released by the mark, not the collective timeout
    assert_replicas_equal([r["params"] for r in results], reference=single_process(JOB),
                          **EXACT)
    assert_exactly_once(tmp_path, JOB.samples, JOB.epochs)


@pytest.mark.timeout(120)
def test_a_lone_survivor_trains_on_alone(tmp_path: Path) -> None:
    """2 workers, one killed: the survivor's generation has one member, whose backward
    never communicates; its steps must still be applied (the failure belonged to the
    previous generation)."""
    job = replace(JOB, expected=2)
    results = _run(Faults().kill(1, KILL_AT), 2, tmp_path, job)
    survivor = results[0]
    assert results[1] is None and survivor["world_size"] == 1 and survivor["redone"] == 1
    assert_replicas_equal([survivor["params"]], reference=single_process(job), **EXACT)
    assert_exactly_once(tmp_path, job.samples, job.epochs)


def _join_leave(rank: int, world_size: int, port: int, ledger_dir: str) -> dict[str, Any]:
    from torch.distributed import TCPStore

    # Rank 2 is a late worker: it joins once the founders train (an event, not a head
    # start: a founder's slow start-up could otherwise let rank 2 found the cohort). The
    # founders then wait at step 3 until it asks to join, so it is admitted mid-run on any
    # machine; rank 1 leaves two steps after that, and rank 2 stays to the end.
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=100))
    worker = start_worker(JOIN_JOB, f"worker-{rank}", "127.0.0.1", port,
                          before_join=(lambda: store.wait([TRAINING_KEY]))
                          if rank == 2 else None)
    cohort, model, cursor, opt = worker.cohort, worker.model, worker.cursor, worker.optimizer
    opt.leave_on_sigterm()
    sizes: list[int] = []
    splits: list[tuple[int, list[int]]] = []  # (world size, samples per rank) per step
    grown_at = None
    with SampleLedger(Path(ledger_dir, f"rank{rank}.jsonl")) as ledger:
        while cursor.epoch < JOIN_JOB.epochs and not opt.left:
            for index, x, y in worker.loader:
                if rank == 0 and opt.steps == 1:
                    store.set(TRAINING_KEY, "1")
                if rank < 2 and opt.steps == 3 and cohort.world_size == 2:
                    wait_for_joiner(cohort)
                if grown_at is None and cohort.world_size == 3:
                    grown_at = opt.steps
                if rank == 1 and grown_at is not None and opt.steps == grown_at + 2:
                    os.kill(os.getpid(), signal.SIGTERM)  # the owner wants the GPU back
                epoch = cursor.epoch
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                split = (cohort.world_size, list(worker.loader.split))
                if opt.step().committed:
                    ledger.record(epoch, index.tolist())
                    sizes.append(cohort.world_size)
                    splits.append(split)
    cohort.close()
    return {"params": params(model.module), "left": opt.left, "sizes": sizes,
            "splits": splits,
            "events": cohort.events, "joined_late": cohort.joined_late,
            "redone": opt.redone}


# Balancing on: a joiner gets a provisional share, a leaver's share is redistributed.
JOIN_JOB = replace(JOB, epochs=6, expected=2, collective_timeout=20.0, balance=True)


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
    # A graceful leave is a boundary like an admission: no recovery, no step redone (a
    # leave noticed by a timeout would be a recovery with a redone step).
    assert [e["cause"] for e in founder["events"]] == ["boundary", "boundary"]
    assert founder["events"][1]["left"] and founder["redone"] == joiner["redone"] == 0
    # Every step was split among exactly its members, each with a sample at least.
    assert {size for size, _ in founder["splits"]} == {2, 3}
    for size, split in founder["splits"]:
        assert len(split) == size and min(split) >= 1 and sum(split) == JOIN_JOB.global_batch
    assert_replicas_equal([founder["params"], joiner["params"]],
                          reference=single_process(JOIN_JOB), **EXACT)
    assert_exactly_once(tmp_path, JOIN_JOB.samples, JOIN_JOB.epochs)
    del store
