"""The smallest potluck job: run it with `potluck run --nproc-per-node 2 examples/minimal.py`.

It runs unchanged under `torchrun --nproc-per-node 2 examples/minimal.py` and as a
plain `python examples/minimal.py` (one process). Pass --out FILE to save the final
parameters (the tests compare them across launchers and hosts).
"""

import argparse

import torch

import potluck

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--global-batch", type=int, default=32)
parser.add_argument("--out", default=None, help="save the final parameters here (rank 0)")
args = parser.parse_args()

torch.set_num_threads(1)
cohort = potluck.init()  # reads RANK, WORLD_SIZE, MASTER_ADDR ... from the launcher
torch.manual_seed(0)  # same data and same initial model on every rank

# A synthetic regression problem: y = x @ w_true + noise.
x = torch.randn(1024, 8)
y = x @ torch.randn(8, 1) + 0.01 * torch.randn(1024, 1)

model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
model = model.to(cohort.device)
ddp = potluck.DataParallel(model, group=cohort.group)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)

local = args.global_batch // cohort.world_size  # this rank's share of each global batch
for step in range(args.steps):
    start = (step * args.global_batch) % len(x) + cohort.rank * local
    xb, yb = x[start : start + local], y[start : start + local]
    loss = torch.nn.functional.mse_loss(ddp(xb.to(cohort.device)), yb.to(cohort.device))
    opt.zero_grad()
    loss.backward()  # gradients are averaged across ranks before this returns
    opt.step()

if cohort.rank == 0:
    print(f"final loss {loss.item():.4f} after {args.steps} steps on {cohort.world_size} rank(s)")
    if args.out:
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, args.out)
cohort.close()
