"""Below ``min_workers`` the cohort stops training and waits for joiners.

Two endings. A worker joins in time: it is admitted with the live state and the run
goes on (equal to one process, every sample exactly once). Nobody joins: rank 0 writes a
checkpoint, every member raises ``BelowMinimumError`` naming it, and a new run started
with ``resume=True`` finishes the job from there, again equal to one uninterrupted
process (float64, 1e-9: only the summation order of the gradient all-reduce differs).
"""

from __future__ import annotations

import os
import signal
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

KILL_AT = 3
JOB = ElasticJob(epochs=2)
EPOCHS, N, GLOBAL_BATCH = JOB.epochs, JOB.samples, JOB.global_batch


def _worker(rank: int, port: int, *, expected: int, min_workers: int, wait_s: float,
            checkpoint_dir: str, resume: bool = False) -> tuple[Any, Any, Any, Any, Any]:
    from potluck import MinimumSize, prepare
    from potluck.cohort import GroupSpec, join_elastic
    from potluck.rendezvous import RendezvousConfig

    net = tiny_mlp()  # model and optimizer first: an admitted joiner keeps the cohort waiting
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=False,
                                       timeout=timedelta(seconds=30))
    config = RendezvousConfig(token="min", expected=expected, heartbeat_interval=0.2,
                              heartbeat_timeout=1.5, settle_timeout=10.0, join_timeout=60.0)
    cohort = join_elastic(store, f"worker-{rank}-{os.getpid()}", config,
                          GroupSpec("gloo", 10.0, "127.0.0.1"))
    model, opt, loader = prepare(net, sgd, Indexed(N), cohort=cohort,
                                 global_batch=GLOBAL_BATCH, seed=JOB.data_seed,
                                 minimum=MinimumSize(min_workers, wait_s),
                                 checkpoint_dir=checkpoint_dir, resume=resume)
    return cohort, model, opt.cursor, opt, loader


def _train(rank: int, opt: Any, model: Any, cursor: Any, loader: Any, ledger_dir: str,
           victim: int | None) -> None:
    with SampleLedger(Path(ledger_dir, f"rank{rank}-{os.getpid()}.jsonl")) as ledger:
        while cursor.epoch < EPOCHS:
            for index, x, y in loader:
                if rank == victim and opt.steps == KILL_AT:
                    Path(ledger_dir, "killed").touch()
                    os.kill(os.getpid(), signal.SIGKILL)
                epoch = cursor.epoch
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                if opt.step().committed:
                    ledger.record(epoch, index.tolist())


def _wait_for_generation(port: int, number: int) -> None:
    """Until the rendezvous published generation ``number`` (the cohort below minimum)."""
    from potluck import keys
    from potluck.rendezvous import RendezvousConfig

    store = torch.distributed.PrefixStore(
        RendezvousConfig(token="min").prefix,
        torch.distributed.TCPStore("127.0.0.1", port, is_master=False,
                                   timeout=timedelta(seconds=30)))
    while not (store.check([keys.CURRENT]) and int(store.get(keys.CURRENT)) >= number):
        time.sleep(0.05)


def _joiner_in_time(rank: int, world_size: int, port: int, ledger_dir: str,
                    checkpoint_dir: str) -> dict[str, Any]:
    if rank == 3:  # arrives only once the survivors formed generation 1 without the victim
        _wait_for_generation(port, 1)
    cohort, model, cursor, opt, loader = _worker(rank, port, expected=3, min_workers=3,
                                                 wait_s=60.0, checkpoint_dir=checkpoint_dir)
    _train(rank, opt, model, cursor, loader, ledger_dir, victim=2)
    cohort.close()
    return {"params": params(model.module), "world_size": cohort.world_size,
            "waited_s": opt.waited_s, "steps": opt.steps}


@pytest.mark.timeout(120)
def test_cohort_below_minimum_waits_and_a_joiner_lets_it_go_on(tmp_path: Path) -> None:
    port = free_port()
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True,
                                       wait_for_workers=False, timeout=timedelta(seconds=30))
    results = run_ranks(_joiner_in_time, 4, port, str(tmp_path), str(tmp_path / "ckpt"),
                        init_group=False, may_die={2}, timeout=100)
    assert results[2] is None
    for rank in (0, 1, 3):
        result = results[rank]
        assert result["world_size"] == 3 and result["steps"] == EPOCHS * (N // GLOBAL_BATCH)
    assert_replicas_equal([r and r["params"] for r in results], reference=single_process(JOB),
                          rtol=1e-9, atol=1e-12)
    # the joiner came only once generation 1 (two workers) existed: the survivors waited
    assert results[0]["waited_s"] > 0
    assert_exactly_once(tmp_path, N, EPOCHS)
    assert not (tmp_path / "ckpt").exists()  # a joiner came: no checkpoint, no stop
    del store


def _nobody_joins(rank: int, world_size: int, port: int, ledger_dir: str,
                  checkpoint_dir: str, resume: bool) -> dict[str, Any]:
    from potluck.errors import BelowMinimumError

    cohort, model, cursor, opt, loader = _worker(rank, port, expected=2, min_workers=2,
                                                 wait_s=1.5, checkpoint_dir=checkpoint_dir,
                                                 resume=resume)
    started_at = opt.steps
    try:
        _train(rank, opt, model, cursor, loader, ledger_dir, victim=None if resume else 1)
    except BelowMinimumError as exc:
        return {"stopped": str(exc), "checkpoint": exc.checkpoint, "steps": opt.steps}
    finally:
        cohort.close()
    return {"params": params(model.module), "started_at": started_at, "steps": opt.steps}


@pytest.mark.timeout(150)
def test_nobody_joins_checkpoint_and_stop_then_resume_equals_one_run(tmp_path: Path) -> None:
    checkpoints, ledgers = tmp_path / "ckpt", tmp_path / "ledger"
    ledgers.mkdir()
    port = free_port()
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True,
                                       wait_for_workers=False, timeout=timedelta(seconds=30))
    first = run_ranks(_nobody_joins, 2, port, str(ledgers), str(checkpoints), False,
                      init_group=False, may_die={1}, timeout=100)
    assert first[1] is None
    stopped = first[0]
    assert stopped["steps"] == KILL_AT
    assert "below min_workers=2" in stopped["stopped"]
    assert "nobody joined within 1.5 s" in stopped["stopped"]
    assert stopped["checkpoint"] and stopped["checkpoint"] in stopped["stopped"]
    assert Path(stopped["checkpoint"]).is_file()
    del store

    port = free_port()
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True,
                                       wait_for_workers=False, timeout=timedelta(seconds=30))
    second = run_ranks(_nobody_joins, 2, port, str(ledgers), str(checkpoints), True,
                       init_group=False, timeout=100)
    for result in second:
        assert result["started_at"] == KILL_AT
        assert result["steps"] == EPOCHS * (N // GLOBAL_BATCH)
    assert_replicas_equal([r["params"] for r in second], reference=single_process(JOB),
                          rtol=1e-9, atol=1e-12)
    assert_exactly_once(ledgers, N, EPOCHS)
    del store
