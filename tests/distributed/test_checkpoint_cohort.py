"""Checkpoints under ``potluck.init()``: with no torch default group, the defaults follow
the current cohort, so only its rank 0 writes and ``DistributedRng`` gathers every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from potluck.checkpoint import CheckpointManager, DistributedRng
from potluck.cohort.current import current
from potluck.testing import free_port, join, run_ranks


def _save_and_restore(rank: int, world_size: int, port: int, directory: str) -> dict[str, Any]:
    import torch.distributed as dist

    cohort = join(rank, world_size, port, timeout=60.0)
    assert current() is cohort and not dist.is_initialized()
    torch.manual_seed(100 + rank)  # each rank's own stream
    manager = CheckpointManager(directory)  # rank=None: the cohort's
    state = {"who": torch.tensor([rank]), "rng": DistributedRng()}
    written = manager.save(1, state).wait()
    expected = torch.rand(4)  # what a resumed run must draw next, on this rank
    cohort.barrier()  # the file is complete before anyone reads it
    torch.manual_seed(999)  # clobber this rank's generator
    step = manager.restore_latest({"rng": DistributedRng()})
    again = torch.rand(4)
    saved = manager.load_latest().state  # type: ignore[union-attr]
    writer = manager.is_writer
    cohort.close()
    return {"writer": writer, "written": written, "step": step, "expected": expected,
            "again": again, "who": int(saved["who"]), "rng_world_size": saved["rng"]["world_size"],
            "rng_torch": [r["torch"] for r in saved["rng"]["ranks"]],
            "current_after_close": current()}


@pytest.mark.timeout(60)
def test_only_the_cohorts_rank_0_writes_and_every_rank_gets_its_own_rng(
        tmp_path: Path) -> None:
    directory = tmp_path / "ckpts"
    results = run_ranks(_save_and_restore, 2, free_port(), str(directory),
                        init_group=False, timeout=60)
    assert [r["writer"] for r in results] == [True, False]
    assert [r["written"] for r in results] == [directory / "ckpt-000000000001.pt", None]
    assert [p.name for p in directory.iterdir()] == ["ckpt-000000000001.pt"]
    for result in results:
        assert result["step"] == 1 and result["who"] == 0  # rank 0's file, read by both
        assert result["rng_world_size"] == 2
        assert torch.equal(result["again"], result["expected"])  # its own stream back
        assert result["current_after_close"] is None
    zero, one = results[0]["rng_torch"]
    assert not torch.equal(zero, one)  # two ranks' states, not one copied
    assert not torch.equal(results[0]["expected"], results[1]["expected"])
