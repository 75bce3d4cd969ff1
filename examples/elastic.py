"""Runs under `python`, `torchrun`, `potluck run` and, e.g., `potluck run --elastic --token S
--nproc-per-node 3 --max-restarts 2 examples/elastic.py`: kill -9 a worker and the others
redo the step; it restarts and rejoins with the live state. See docs/elastic.md."""
import argparse
import os
import time

import torch

import potluck

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--out", help="rank 0 saves the final parameters here")
parser.add_argument("--step-time", type=float, default=0.1, help="extra seconds per step")
parser.add_argument("--checkpoint-dir", default="checkpoints/elastic")  # below --min-workers
parser.add_argument("--resume", action="store_true")  # from --checkpoint-dir
parser.add_argument("--fail-at", type=int, help="(tests) rank 1's first run dies here")
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(*torch.randn(2, 96, 8, dtype=torch.float64,
                                                   generator=torch.Generator().manual_seed(0)))
net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
sgd = torch.optim.SGD(net.double().parameters(), lr=0.05, momentum=0.9)
model, opt, loader = potluck.prepare(net, sgd, data, global_batch=12, seed=3, timeout=20,
                                     checkpoint_dir=args.checkpoint_dir, resume=args.resume)
opt.leave_on_sigterm()
me = (os.environ.get("RANK"), os.environ.get("TORCHELASTIC_RESTART_COUNT"))
while loader.epoch < args.epochs and not opt.left:
    for x, y in loader:
        if opt.steps == args.fail_at and me == ("1", "0"):
            os.kill(os.getpid(), 9)  # SIGKILL, as a preempted GPU: no warning
        time.sleep(args.step_time)  # stand-in for real compute
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    if opt.cohort.rank == 0 and not opt.left:
        print(f"epoch {loader.epoch - 1} done at step {opt.steps} with "
              f"{opt.cohort.world_size} workers", flush=True)
# False on a worker that left (SIGTERM): the others train on, so the result is theirs.
if opt.finish() and opt.cohort.rank == 0 and args.out:
    torch.save(net.state_dict(), args.out)
