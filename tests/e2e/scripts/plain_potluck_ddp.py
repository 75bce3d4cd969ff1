"""A plain DDP script on ``potluck.DataParallel``: torch's ``init_process_group``, no
``potluck.prepare``. Each step takes two micro-batches (the first under ``no_sync()``)
and sleeps ``--step-ms``, until a stop file appears; then rank 0 prints the step count.

Every rank stops after the same step: each step all-reduces whether any rank saw the
stop file (a count written into the file would let one rank stop a step before another).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import potluck


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--max-steps", type=int, default=3000)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = potluck.DataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stop, steps = Path(args.stop_file), 0
    while steps < args.max_steps:
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        with model.no_sync():  # a micro-batch: not a step of its own
            ((model(x[:2]) - y[:2]) ** 2).mean().backward()
        ((model(x[2:]) - y[2:]) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
        time.sleep(args.step_ms / 1000)
        seen = torch.tensor(float(stop.exists()))
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        if seen.item() > 0:
            break
    if dist.get_rank() == 0:
        print(f"steps: {steps}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
