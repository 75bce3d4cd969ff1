"""Exactly-once data across real Gloo ranks: every rank writes a ``SampleLedger`` of the
samples it trained on, through a real DataLoader with worker processes. The test process
reads the ledgers back. They must cover the epoch exactly once and in the same global
order whatever the world size, the shares, or a change of both mid-epoch.
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from potluck.data import DataCursor
from potluck.testing import SampleLedger, assert_exactly_once, read_ledgers, run_ranks

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
           steps: int | None, num_workers: int, ledger_dir: Path) -> None:
    """Run up to ``steps`` committed steps (None: to the end of the epoch). Each committed
    step's samples go to this rank's ledger, ``ledger_dir/rank<r>/ids.jsonl``."""
    allow_worker_processes()
    loader = cursor.loader(IndexDataset(), rank=rank, shares=shares, world_size=world_size,
                           num_workers=num_workers, prefetch_factor=2,
                           multiprocessing_context="fork")
    (ledger_dir / f"rank{rank}").mkdir(exist_ok=True)
    with SampleLedger(ledger_dir / f"rank{rank}" / "ids.jsonl") as ledger:
        for done, batch in enumerate(loader, start=1):
            mine = [] if batch is None else batch.tolist()
            count = torch.tensor([len(mine)])
            dist.all_reduce(count)  # stands in for the step's gradient all-reduce
            assert int(count) == len(cursor.global_indices())
            ledger.record(cursor.epoch, mine)
            cursor.commit()
            if steps is not None and done == steps:
                break


def _epoch(rank: int, world_size: int, shares: list[float] | None, drop_last: bool,
           num_workers: int, ledger_dir: Path) -> dict[str, Any]:
    cursor = DataCursor(N, GLOBAL_BATCH, seed=SEED, drop_last=drop_last)
    _train(cursor, rank, shares, world_size, None, num_workers, ledger_dir)
    return cursor.state_dict()


def ledgers(ledger_dir: Path, world_size: int) -> list[list[tuple[int, list[int]]]]:
    """Each rank's ledger, in rank order: an ``(epoch, ids)`` record per step."""
    return [read_ledgers(ledger_dir / f"rank{rank}") for rank in range(world_size)]


def global_stream(ledgers: list[list[tuple[int, list[int]]]]) -> list[int]:
    """Step by step, the ranks' parts in rank order."""
    return [i for step in zip(*ledgers, strict=True) for _, part in step for i in part]


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
    world_size: int, shares: list[float] | None, drop_last: bool, num_workers: int,
    tmp_path: Path,
) -> None:
    states = run_ranks(_epoch, world_size, shares, drop_last, num_workers, tmp_path)
    per_rank = ledgers(tmp_path, world_size)
    assert global_stream(per_rank) == expected_stream(drop_last)  # same order as one process
    # Exactly once; under drop_last, exactly the remainder of the permutation is left out.
    assert_exactly_once([record for ledger in per_rank for record in ledger],
                        expected_stream(drop_last))
    if shares == [0.0, 1.0, 1.0]:
        assert all(part == [] for _, part in per_rank[0])
    assert all(state["epoch"] == 1 and state["cursor"] == 0 for state in states)


def _first_part(rank: int, world_size: int, steps: int, ledger_dir: Path) -> dict[str, Any]:
    cursor = DataCursor(N, GLOBAL_BATCH, seed=SEED)
    _train(cursor, rank, None, world_size, steps, 1, ledger_dir)
    return cursor.state_dict()


def _second_part(rank: int, world_size: int, saved: dict[str, int],
                 shares: list[float], ledger_dir: Path) -> None:
    cursor = DataCursor(N, GLOBAL_BATCH)  # seed and position come from the saved state
    cursor.load_state_dict(saved)
    _train(cursor, rank, shares, world_size, None, 1, ledger_dir)


@pytest.mark.timeout(90)
def test_world_size_and_shares_change_mid_epoch(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    states = run_ranks(_first_part, 2, 3, first)
    saved = states[0]
    assert saved == states[1] and saved["cursor"] == 3 * GLOBAL_BATCH
    run_ranks(_second_part, 3, saved, [1.0, 2.0, 3.0], second)
    before, after = ledgers(first, 2), ledgers(second, 3)
    assert global_stream(before) + global_stream(after) == expected_stream(drop_last=False)
    assert_exactly_once([record for ledger in before + after for record in ledger], N)
