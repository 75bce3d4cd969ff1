"""Train a tiny model with checkpoints; run again to resume where it stopped.

    python examples/checkpoint_resume.py --steps 20 --dir /tmp/potluck-ckpt
    python examples/checkpoint_resume.py --steps 40 --dir /tmp/potluck-ckpt  # resumes

One process; under a launcher, pass the rank and world size from the process group.
"""

from __future__ import annotations

import argparse
import logging

import torch
from torch.utils.data import TensorDataset

from potluck import CheckpointManager, DataCursor, DistributedRng


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dir", default="checkpoints")
    parser.add_argument("--every", type=int, default=5, help="save every N steps")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    gen = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(256, 8, generator=gen), torch.randn(256, 1, generator=gen))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cursor = DataCursor(len(dataset), global_batch=32, seed=0)
    state = {"model": model, "optimizer": optimizer, "cursor": cursor, "rng": DistributedRng()}
    checkpoints = CheckpointManager(args.dir, keep=3)

    step = checkpoints.restore_latest(state) or 0
    print(f"starting at step {step}, epoch {cursor.epoch}, sample {cursor.cursor}")
    loader = cursor.loader(dataset, rank=0, world_size=1)
    while step < args.steps:
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            cursor.commit()
            step += 1
            if step % args.every == 0:
                checkpoints.save(step, state, blocking=False)
                print(f"step {step} loss {loss.item():.4f} (checkpoint)")
            if step == args.steps:
                break
    checkpoints.wait()


if __name__ == "__main__":
    main()
