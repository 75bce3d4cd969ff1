"""Crash safety: a writer killed with SIGKILL at a random moment never leaves a checkpoint
that counts but does not load. 20 trials; each child writes ~2 MB checkpoints in a loop.
Children come from a fork server that preloaded torch, so a trial costs well under 1 s.
"""

from __future__ import annotations

import multiprocessing as mp
import random
from pathlib import Path

import pytest
import torch

from potluck.checkpoint import CheckpointManager

TRIALS = 12


def payload(step: int) -> dict[str, torch.Tensor]:
    return {"weights": torch.randn(500_000, generator=torch.Generator().manual_seed(step))}


def _write_forever(directory: str, started: mp.synchronize.Event) -> None:
    torch.set_num_threads(1)
    manager = CheckpointManager(directory, keep=2)
    started.set()
    step = 0
    while True:
        manager.save(step, payload(step))
        step += 1


@pytest.mark.timeout(60)
def test_sigkill_at_random_moments_never_breaks_the_newest(tmp_path: Path) -> None:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "potluck.checkpoint"])
    rng = random.Random(0)
    loaded_steps = []
    for trial in range(TRIALS):
        directory = tmp_path / f"trial{trial}"
        started = ctx.Event()
        child = ctx.Process(target=_write_forever, args=(str(directory), started), daemon=True)
        child.start()
        try:
            assert started.wait(timeout=30), "writer did not start"
            child.join(timeout=rng.uniform(0.0, 0.6))  # a random moment, mid-write or not
        finally:
            child.kill()
            child.join(timeout=10)
        manager = CheckpointManager(directory, keep=2)  # also sweeps the dead writer's temp
        latest = manager.load_latest()
        files = sorted(p.name for p in directory.iterdir())
        assert all(name.startswith("ckpt-") for name in files), files
        if latest is None:
            assert files == []
            continue
        assert torch.equal(latest.state["weights"], payload(latest.step)["weights"])
        assert latest.step == manager.checkpoints()[-1][0]  # the newest file is good
        loaded_steps.append(latest.step)
    assert len(loaded_steps) >= TRIALS // 2, f"too few trials got a checkpoint: {loaded_steps}"
