"""Exactly-once data across real Gloo ranks: every rank keeps a ledger of the samples it
trained on, through a real DataLoader with worker processes, and the test process checks
that the ledgers cover the epoch exactly once and in the same global order whatever the
world size, the shares, or a change of both mid-epoch.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from potluck.data import DataCursor
from potluck.testing import run_ranks

N, GLOBAL_BATCH, SEED = 53, 8, 5  # 53 = 6 * 8 + 5: a remainder of 5


class IndexDataset(Dataset[torch.Tensor]):
    """Sample i is the tensor i, so a batch shows which indices were trained on."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)


def allow_worker_processes() -> None:
    """run_ranks starts ranks as daemonic processes, which may not have children; a
    DataLoader worker is a child. The rank is reaped by run_ranks and its workers watch
    their parent, so lifting the flag leaks nothing. Ranks inherit the forkserver start
    method, under which every worker would re-import this module (seconds); workers are
    forked instead, as a DataLoader on Linux does by default."""
    mp.current_process().daemon = False


def _train(cursor: DataCursor, rank: int, shares: list[float] | None, world_size: int,
           steps: int | None, num_workers: int) -> list[list[int]]:
    """Run up to ``steps`` committed steps (None: to the end of the epoch); a ledger."""
    allow_worker_processes()
    loader = cursor.loader(IndexDataset(), rank=rank, shares=shares, world_size=world_size,
                           num_workers=num_workers, prefetch_factor=2,
                           multiprocessing_context="fork")
    ledger: list[list[int]] = []
    for batch in loader:
        mine = [] if batch is None else batch.tolist()
        count = torch.tensor([len(mine)])
        dist.all_reduce(count)  # stands in for the step's gradient all-reduce
        assert int(count) == len(cursor.global_indices())
        ledger.append(mine)
        cursor.commit()
        if steps is not None and len(ledger) == steps:
            break
    return ledger


def _epoch(rank: int, world_size: int, shares: list[float] | None, drop_last: bool,
           num_workers: int) -> dict[str, Any]:
    cursor = DataCursor(N, GLOBAL_BATCH, seed=SEED, drop_last=drop_last)
    ledger = _train(cursor, rank, shares, world_size, None, num_workers)
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, ledger)
    return {"ledgers": gathered, "state": cursor.state_dict()}


def global_stream(ledgers: list[list[list[int]]]) -> list[int]:
    """Step by step, the ranks' parts in rank order."""
    return [i for step in zip(*ledgers, strict=True) for part in step for i in part]


def expected_stream(drop_last: bool) -> list[int]:
    perm = DataCursor(N, GLOBAL_BATCH, seed=SEED).permutation(0).tolist()
    return perm[: N - N % GLOBAL_BATCH] if drop_last else perm


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("world_size", "shares", "drop_last", "num_workers"),
    [(1, None, False, 2), (2, None, True, 1), (3, None, False, 1),
     (3, [1.0, 2.0, 3.0], False, 1), (3, [1.0, 2.0, 3.0], True, 2), (3, [0.0, 1.0, 1.0], True, 1)],
)
def test_every_sample_exactly_once_same_global_order(
    world_size: int, shares: list[float] | None, drop_last: bool, num_workers: int
) -> None:
    results = run_ranks(_epoch, world_size, shares, drop_last, num_workers)
    ledgers = results[0]["ledgers"]
    assert all(r["ledgers"] == ledgers for r in results)  # all_gather agrees everywhere
    stream = global_stream(ledgers)
    assert stream == expected_stream(drop_last)  # same order as one process
    assert len(set(stream)) == len(stream)  # exactly once
    dropped = set(range(N)) - set(stream)
    tail = expected_stream(drop_last=False)[N - N % GLOBAL_BATCH:]
    assert dropped == (set(tail) if drop_last else set())  # exactly the remainder
    if shares == [0.0, 1.0, 1.0]:
        assert all(part == [] for part in ledgers[0])
    assert all(r["state"]["epoch"] == 1 and r["state"]["cursor"] == 0 for r in results)


def _first_part(rank: int, world_size: int, steps: int) -> dict[str, Any]:
    cursor = DataCursor(N, GLOBAL_BATCH, seed=SEED)
    ledger = _train(cursor, rank, None, world_size, steps, 1)
    return {"ledger": ledger, "state": cursor.state_dict()}


def _second_part(rank: int, world_size: int, saved: dict[str, int],
                 shares: list[float]) -> list[list[int]]:
    cursor = DataCursor(N, GLOBAL_BATCH)  # seed and position come from the saved state
    cursor.load_state_dict(saved)
    return _train(cursor, rank, shares, world_size, None, 1)


@pytest.mark.timeout(90)
def test_world_size_and_shares_change_mid_epoch() -> None:
    first = run_ranks(_first_part, 2, 3)
    saved = first[0]["state"]
    assert saved == first[1]["state"] and saved["cursor"] == 3 * GLOBAL_BATCH
    second = run_ranks(_second_part, 3, saved, [1.0, 2.0, 3.0])
    stream = global_stream([r["ledger"] for r in first]) + global_stream(second)
    assert stream == expected_stream(drop_last=False)
    assert sorted(stream) == list(range(N))
