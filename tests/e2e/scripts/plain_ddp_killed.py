"""A plain torch DDP script (no potluck), as pytorch/examples' DDP tutorial: rank 1
SIGKILLs itself at step 3 of each attempt named by ``--die-in`` (as ``kill -9`` would)."""

import argparse
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--die-in", default="0", help="attempts in which rank 1 dies, e.g. 0,1")
args = parser.parse_args()

torch.set_num_threads(1)
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"attempt {attempt} started", flush=True)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
for step in range(6):
    if step == 3 and rank == 1 and attempt in args.die_in.split(","):
        os.kill(os.getpid(), signal.SIGKILL)
    model(torch.ones(8, 4)).sum().backward()
print(f"attempt {attempt} done", flush=True)
dist.destroy_process_group()
