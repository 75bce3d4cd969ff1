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
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

from potluck.bench.ranks import free_port, run_ranks
from tests.distributed import models as M

N, GLOBAL_BATCH, EPOCHS, KILL_AT = 48, M.GLOBAL_BATCH, 2, 3
COLLECTIVE_TIMEOUT = 4.0  # a frozen peer is given up on after this long


class Indexed(Dataset[tuple[int, torch.Tensor, torch.Tensor]]):
    def __init__(self) -> None:
        self.x, self.y = M.batch(0, size=N)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i]


def _elastic_worker(rank: int, port: int, *, expected: int, token: str = "secret",
                    timeout: float = 20.0) -> tuple[Any, Any, Any, Any, Any]:
    """One worker's cohort, model, cursor, optimizer and loader (the store is the test's)."""
    from torch.distributed import TCPStore

    from potluck import DataCursor, DataParallel
    from potluck.elastic import ElasticCohort, ElasticLoader, ElasticOptimizer
    from potluck.rendezvous import RendezvousConfig
    from potluck.step import GuardedOptimizer

    store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    config = RendezvousConfig(token=token, expected=expected, heartbeat_interval=0.2,
                              heartbeat_timeout=1.5, settle_timeout=10.0, join_timeout=60.0)
    cohort = ElasticCohort(store, f"worker-{rank}", config, timeout=timeout)
    model = DataParallel(M.mlp(), group=cohort.group, on_failure="abandon",
                         init_sync=not cohort.joined_late)
    cursor = DataCursor(N, GLOBAL_BATCH, seed=5)
    opt = ElasticOptimizer(GuardedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1,
                                                            momentum=0.9)),
                           model, cohort, cursor)
    loader = ElasticLoader(Indexed(), cursor, lambda: (cohort.rank, cohort.world_size),
                           stop=lambda: opt.left)
    return cohort, model, cursor, opt, loader


def assert_exactly_once(ledger_dir: Path, epochs: int, context: str = "") -> None:
    """Every sample of every epoch in the committed-sample ledgers exactly once."""
    ledger = [json.loads(line) for f in sorted(ledger_dir.glob("rank*.jsonl"))
              for line in f.read_text().splitlines()]
    for epoch in range(epochs):
        trained = sorted(i for e, idx in ledger if e == epoch for i in idx)
        assert trained == list(range(N)), f"{context} epoch {epoch}: not exactly once"


def _elastic(rank: int, world_size: int, port: int, victim: int,
             ledger_dir: str, fault: str = "kill") -> dict[str, Any]:
    cohort, model, cursor, opt, loader = _elastic_worker(rank, port, expected=world_size,
                                                         timeout=COLLECTIVE_TIMEOUT)
    step, detected_s = 0, None
    with Path(ledger_dir, f"rank{rank}.jsonl").open("a") as ledger:  # outlives a SIGKILL
        for _ in range(EPOCHS):
            for index, x, y in loader:
                if step == KILL_AT and rank == victim:
                    sig = signal.SIGKILL if fault == "kill" else signal.SIGSTOP
                    os.kill(os.getpid(), sig)
                epoch, started = cursor.epoch, time.monotonic()
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                if model.step_failed and detected_s is None:
                    detected_s = time.monotonic() - started
                if opt.step().committed:
                    ledger.write(json.dumps([epoch, index.tolist()]) + "\n")
                    ledger.flush()
                    step += 1
    cohort.close()
    return {"params": M.params(model.module), "redone": opt.redone, "detected_s": detected_s,
            "world_size": cohort.world_size, "generation": cohort.generation,
            "events": cohort.events}


def _single_process(epochs: int = EPOCHS) -> dict[str, torch.Tensor]:
    from potluck import DataCursor

    model = M.mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cursor, data = DataCursor(N, GLOBAL_BATCH, seed=5), Indexed()
    for _ in range(epochs * (N // GLOBAL_BATCH)):
        idx = cursor.global_indices()
        opt.zero_grad()
        ((model(data.x[idx]) - data.y[idx]) ** 2).mean().backward()
        opt.step()
        cursor.commit()
    return M.params(model)


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
    expected = _single_process()
    for result in survivors:
        assert result["world_size"] == 2 and result["generation"] == 1
        assert result["redone"] == 1
        for name, value in expected.items():
            torch.testing.assert_close(result["params"][name], value, rtol=1e-9, atol=1e-12)
        # Recovery: the rendezvous waits for the lost worker's heartbeat to go stale
        # (1.5 s); a frozen peer is first noticed at the collective timeout.
        assert result["events"][0]["recovery_s"] < 5
        assert result["detected_s"] < (COLLECTIVE_TIMEOUT + 3 if fault == "stop" else 3)
    assert_exactly_once(tmp_path, EPOCHS)
    del store


def _join_leave(rank: int, world_size: int, port: int, ledger_dir: str) -> dict[str, Any]:
    if rank == 2:
        time.sleep(1.5)  # a late worker: the cohort is already training
    cohort, model, cursor, opt, loader = _elastic_worker(rank, port, expected=2)
    opt.leave_on_sigterm()
    sizes, asked = [], False
    with Path(ledger_dir, f"rank{rank}.jsonl").open("a") as ledger:
        while cursor.epoch < JOIN_EPOCHS and not opt.left:
            for index, x, y in loader:
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
    return {"params": M.params(model.module), "left": opt.left, "sizes": sizes,
            "events": cohort.events, "joined_late": cohort.joined_late}


JOIN_EPOCHS = 6


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
    expected = _single_process(epochs=JOIN_EPOCHS)
    for result in (founder, joiner):
        for name, value in expected.items():
            torch.testing.assert_close(result["params"][name], value, rtol=1e-9, atol=1e-12)
    assert_exactly_once(tmp_path, JOIN_EPOCHS)
    del store
