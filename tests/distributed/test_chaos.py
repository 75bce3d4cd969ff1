"""Chaos: random kill / freeze / join events at random steps, over several trials.

Each trial: 3 founders and one late joiner (arriving at a random moment); one founder
is SIGKILLed or SIGSTOPped at a random step. Every run must complete, train every sample
of every epoch exactly once (ledger), and end with the parameters of one process
training on the same global batches (float64, 1e-9: only summation order differs).
run_ranks reaps every process, the frozen one included. More trials: CHAOS_TRIALS.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from potluck.bench.ranks import free_port, run_ranks
from tests.distributed import models as M
from tests.distributed.test_elastic import _elastic_worker, _single_process, assert_exactly_once

EPOCHS = 4
TRIALS = [11, 29]  # seeds; a few in CI


def _plan(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    return {"victim": rng.choice([1, 2]), "fault": rng.choice(["kill", "stop"]),
            "at": rng.randint(2, 10), "join_after": rng.uniform(0.5, 2.5)}


def _chaos(rank: int, world_size: int, port: int, ledger_dir: str,
           plan: dict[str, Any]) -> dict[str, Any]:
    if rank == 3:
        time.sleep(plan["join_after"])
    cohort, model, cursor, opt, loader = _elastic_worker(rank, port, expected=3,
                                                         token="chaos", timeout=4.0)
    with Path(ledger_dir, f"rank{rank}.jsonl").open("a") as ledger:
        while cursor.epoch < EPOCHS:
            for index, x, y in loader:
                if rank == plan["victim"] and opt.steps == plan["at"]:
                    sig = signal.SIGKILL if plan["fault"] == "kill" else signal.SIGSTOP
                    os.kill(os.getpid(), sig)
                time.sleep(0.1)
                epoch = cursor.epoch
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                if opt.step().committed:
                    ledger.write(json.dumps([epoch, index.tolist()]) + "\n")
                    ledger.flush()
    cohort.close()
    return {"params": M.params(model.module), "events": cohort.events}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [int(s) for s in os.environ.get("CHAOS_TRIALS", "").split(",")
                                  if s] or TRIALS)
def test_random_faults_and_joins_lose_nothing(tmp_path: Path, seed: int) -> None:
    from torch.distributed import TCPStore

    plan = _plan(seed)
    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=30))
    results = run_ranks(_chaos, 4, port, str(tmp_path), plan, init_group=False,
                        may_die={plan["victim"]}, timeout=200)
    finished = [r for rank, r in enumerate(results) if rank != plan["victim"]]
    assert all(r is not None for r in finished), plan
    expected = _single_process(epochs=EPOCHS)
    for result in finished:
        for name, value in expected.items():
            torch.testing.assert_close(result["params"][name], value, rtol=1e-9,
                                       atol=1e-12, msg=f"{plan}: {name}")
    assert_exactly_once(tmp_path, EPOCHS, str(plan))
    del store
