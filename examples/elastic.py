"""Elastic training: workers may die, freeze, leave or join; the run goes on.

    potluck run --nproc-per-node 3 --elastic --max-restarts 2 --token SECRET \\
        examples/elastic.py --epochs 4

Kill a worker (`kill -9 <pid>`): the others redo the step without it, the launcher
restarts it, and it rejoins with the cohort's live state. `kill -TERM <pid>` makes a
worker finish its step and leave. Rank 0 saves the final parameters with --out.

With `potluck run --min-workers N`, a cohort that shrinks below N waits for joiners
(`--min-workers-timeout`), then saves a checkpoint in --checkpoint-dir and stops (exit
code 3); run the same command with --resume to continue from it. With
`--nnodes MIN:MAX`, nodes beyond MIN join the running job whenever they start.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
from torch.utils.data import TensorDataset

import potluck.elastic
from potluck import DataCursor, DataParallel
from potluck.env import read_worker_env
from potluck.step import GuardedOptimizer

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--global-batch", type=int, default=12)
parser.add_argument("--out", default=None, help="rank 0 saves the final parameters here")
parser.add_argument("--step-time", type=float, default=0.1, help="extra seconds per step")
parser.add_argument("--checkpoint-dir", default="checkpoints/elastic",
                    help="where the cohort checkpoints if it stops below --min-workers")
parser.add_argument("--resume", action="store_true",
                    help="start from the newest checkpoint in --checkpoint-dir")
parser.add_argument("--fail-at", type=int, default=None,
                    help="(tests) launch rank 1's first incarnation dies at this step")
args = parser.parse_args()

torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(96, 8, generator=gen, dtype=torch.float64),
                     torch.randn(96, 1, generator=gen, dtype=torch.float64))
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
net = net.double()
# Built before joining: a process's first optimizer imports much of torch (seconds), and
# once admitted, a joiner keeps the cohort waiting until it takes the live state.
sgd = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

cohort = potluck.elastic.init(timeout=20.0, heartbeat_timeout=2.0)
model = DataParallel(net, group=cohort.group, on_failure="abandon",
                     init_sync=not cohort.joined_late)
cursor = DataCursor(len(data), args.global_batch, seed=3)
opt = potluck.elastic.ElasticOptimizer(
    GuardedOptimizer(sgd),
    model, cohort, cursor, checkpoint_dir=args.checkpoint_dir,
    resume=args.resume)  # a late joiner receives the live state here
opt.leave_on_sigterm()
loader = potluck.elastic.ElasticLoader(data, cursor, lambda: (cohort.rank, cohort.world_size),
                                       stop=lambda: opt.left)
me = read_worker_env()
doomed = args.fail_at is not None and me.rank == 1 and me.restart_count == 0

while cursor.epoch < args.epochs and not opt.left:
    for x, y in loader:
        if doomed and opt.steps == args.fail_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a preempted GPU: no warning
        time.sleep(args.step_time)  # stand-in for real compute
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    if cohort.rank == 0 and not opt.left:
        print(f"epoch {cursor.epoch - 1} done at step {opt.steps} with "
              f"{cohort.world_size} workers", flush=True)

if cohort.rank == 0 and not opt.left:
    print(f"done: {opt.steps} steps, generation {cohort.generation}, "
          f"{cohort.world_size} workers, events {cohort.events}", flush=True)
    if args.out:
        torch.save({k: v.clone() for k, v in net.state_dict().items()}, args.out)
if opt.left:
    cohort.close()
else:
    cohort.finish()  # a worker still waiting to join is told the run is over
