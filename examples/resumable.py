"""A resumable training job: exactly-once data, checkpoints, clipping, exact resume.

    potluck run --nproc-per-node 2 examples/resumable.py --steps 30 --dir runs/resumable
    # kill it at any moment (even SIGKILL the launcher), then run the same command again:
    # it resumes from the newest good checkpoint, with any number of workers.

Rank 0 appends one JSON line per committed step (step, global loss) to --metrics.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

import potluck
from potluck import CheckpointManager, DataCursor, DistributedRng, GuardedOptimizer

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--global-batch", type=int, default=24)
parser.add_argument("--dir", default="runs/resumable", help="checkpoint directory")
parser.add_argument("--metrics", default=None, help="rank 0 appends JSON lines here")
parser.add_argument("--out", default=None, help="rank 0 saves the final parameters here")
parser.add_argument("--dropout", type=float, default=0.1)
parser.add_argument("--keep", type=int, default=3, help="checkpoints to keep")
parser.add_argument("--hold-at", type=int, default=None,
                    help="after checkpointing this step, write DIR/holding and wait (tests)")
args = parser.parse_args()

torch.set_num_threads(1)
cohort = potluck.init()
gen = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(240, 16, generator=gen), torch.randn(240, 1, generator=gen))

torch.manual_seed(0)  # the same initial model on every rank (DataParallel syncs it anyway)
net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Dropout(args.dropout), torch.nn.Tanh(),
                          torch.nn.Linear(64, 1))
cursor = DataCursor(len(data), args.global_batch, seed=7)
model = potluck.DataParallel(net, group=cohort.group, comm_hook=potluck.weighted_mean,
                             comm_state=lambda: local_n / args.global_batch)
opt = GuardedOptimizer(torch.optim.AdamW(model.parameters(), lr=3e-3),
                       clip_grad_norm=1.0, group=cohort.group)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt.optimizer, T_max=args.steps)
torch.manual_seed(1000 + cohort.rank)  # per-rank randomness (dropout) from here on

state = {"model": net, "optimizer": opt, "scheduler": sched, "cursor": cursor,
         "rng": DistributedRng(cohort.group)}
checkpoints = CheckpointManager(args.dir, keep=args.keep)  # writer: the cohort's rank 0
step = checkpoints.restore_latest(state) or 0

loader = cursor.loader(data, rank=cohort.rank, world_size=cohort.world_size)
while step < args.steps:
    for x, y in loader:
        local_n = len(x)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # averaged, weighted by each rank's share of the global batch
        opt.step()
        sched.step()
        cursor.commit()
        step += 1
        total = torch.tensor([loss.item() * local_n / args.global_batch], dtype=torch.float64)
        cohort.all_reduce_sum(total)
        checkpoints.save(step, state, blocking=False)
        if cohort.rank == 0 and args.metrics:
            with open(args.metrics, "a") as f:
                f.write(json.dumps({"step": step, "loss": total.item(),
                                    "world_size": cohort.world_size}) + "\n")
        if step == args.hold_at:
            checkpoints.wait()
            cohort.barrier()
            if cohort.rank == 0:
                Path(args.dir, "holding").write_text(str(step))
            time.sleep(3600)  # the test kills the whole job here
        if step == args.steps:
            break

checkpoints.wait()
if cohort.rank == 0 and args.out:
    torch.save({k: v.clone() for k, v in net.state_dict().items()}, args.out)
cohort.barrier()  # nobody tears the group down while a peer still uses it
cohort.close()
