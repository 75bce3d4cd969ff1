"""A tiny job on potluck.prepare for the reputation record's tests: ``--steps`` steps;
with ``--fail-first``, rank 1 raises after 3 steps of the first attempt."""

import argparse
import os

import torch

import potluck

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--fail-first", action="store_true")
args = parser.parse_args()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(2048, 16), torch.randn(2048, 1))
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
model, opt, loader = potluck.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01), data,
                                     global_batch=32)
done = 0
while done < args.steps:
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        done += 1
        if args.fail_first and attempt == 0 and opt.cohort.rank == 1 and done == 3:
            raise RuntimeError("rank 1 fails in the first attempt on purpose")
        if done >= args.steps:
            break
opt.finish()
print(f"trained {done} steps", flush=True)
