"""Exact resume on real Gloo ranks: a run checkpointed and resumed equals the same run
uninterrupted, bit for bit (model, optimizer, data cursor and per-rank RNG all restored);
and a checkpoint saved by 2 ranks loads into 3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from potluck import CheckpointManager, DataCursor, DataParallel, DistributedRng
from potluck.testing import run_ranks
from tests.distributed import models as M

N, GLOBAL_BATCH = 48, M.GLOBAL_BATCH


def dataset() -> TensorDataset:
    x, y = M.batch(0, size=N)
    return TensorDataset(x, y)


def _train(rank: int, world_size: int, directory: str, steps: int, restore: bool,
           save_at: int | None) -> dict[str, Any]:
    model = DataParallel(M.mlp())  # M.mlp seeds the global generator: seed ranks after it
    torch.manual_seed(100 + rank)  # per-rank noise below: RNG state matters on resume
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    cursor = DataCursor(N, GLOBAL_BATCH, seed=3)
    manager = CheckpointManager(directory, keep=2)
    objects = {"model": model.module, "optimizer": optimizer, "cursor": cursor,
               "rng": DistributedRng()}
    step = manager.restore_latest(objects) if restore else None
    step = 0 if step is None else step
    start_rng = torch.get_rng_state()
    loader = cursor.loader(dataset(), rank=rank, world_size=world_size)
    while step < steps:
        for x, y in loader:
            optimizer.zero_grad()
            noisy = x + 0.01 * torch.randn_like(x)
            ((model(noisy) - y) ** 2).mean().backward()
            optimizer.step()
            cursor.commit()
            step += 1
            if step == save_at:
                manager.save(step, objects, blocking=False)
            if step == steps:
                break
    manager.wait()
    return {"params": M.params(model.module), "cursor": cursor.state_dict(),
            "start_rng": start_rng}


@pytest.mark.timeout(90)
def test_resumed_run_equals_uninterrupted(tmp_path: Path) -> None:
    whole = run_ranks(_train, 2, str(tmp_path / "a"), 7, False, None)
    run_ranks(_train, 2, str(tmp_path / "b"), 3, False, 3)
    resumed = run_ranks(_train, 2, str(tmp_path / "b"), 7, True, None)
    for ours, theirs in zip(resumed, whole, strict=True):
        assert ours["cursor"] == theirs["cursor"]
        for name, value in theirs["params"].items():
            assert torch.equal(ours["params"][name], value), name


def _load_only(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    model = M.mlp(seed=99)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    cursor = DataCursor(N, GLOBAL_BATCH, seed=3)
    objects = {"model": model, "optimizer": optimizer, "cursor": cursor,
               "rng": DistributedRng()}
    step = CheckpointManager(directory).restore_latest(objects)
    return {"step": step, "params": M.params(model), "cursor": cursor.state_dict(),
            "rng": torch.get_rng_state(), "momentum": optimizer.state_dict()["state"][0]}


@pytest.mark.timeout(90)
def test_saved_by_two_ranks_loads_into_three(tmp_path: Path) -> None:
    saved = run_ranks(_train, 2, str(tmp_path), 2, False, 2)
    loaded = run_ranks(_load_only, 3, str(tmp_path))
    for result in loaded:
        assert result["step"] == 2 and result["cursor"] == saved[0]["cursor"]
        for name, value in saved[0]["params"].items():
            assert torch.equal(result["params"][name], value), name
        assert result["momentum"]["momentum_buffer"] is not None
    rngs = [r["rng"] for r in loaded]
    # ranks 0 and 1 continue their own streams; rank 2 gets a derived, distinct one
    assert not torch.equal(rngs[0], rngs[1]) and not torch.equal(rngs[2], rngs[0])
    assert not torch.equal(rngs[2], rngs[1])
