"""Every mode at once, as a cohort of consumer GPUs needs them: run it as written with
`potluck run --elastic --token-file T --nproc-per-node 3 --max-restarts 2 examples/cohort.py`
(or `potluck run --elastic --balance ...`: balanced shares).

- elastic: kill -9 a worker, the others redo the step; it restarts and rejoins;
- uneven: each worker's share of a step (`--balance`), or of a round, follows its speed;
- far apart: `--far` trains DiLoCo rounds whose pseudo-gradients travel as int8;
  without it every step's gradients travel as int8 (both keep the error per worker);
- untrusted: every step's int8 copies are aggregated robustly and audited, and one step
  in 8 a worker's gradient is recomputed by the others (a spot check, allowing the
  codec's rounding); with `--far` each round's int8 pseudo-gradients are aggregated
  robustly and checked at the round's edge. A worker caught sending bad ones is
  quarantined.
"""
import argparse

import torch

import potluck
from potluck.compress import CompressedSum, Int8Blockwise

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--far", action="store_true", help="DiLoCo rounds (for slow links)")
parser.add_argument("--rounds", type=int, default=4, help="global batches a round (--far)")
parser.add_argument("--checkpoint-dir", default="checkpoints/cohort")  # below --min-workers
args = parser.parse_args()

torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
x = torch.randn(480, 16, generator=gen)
data = torch.utils.data.TensorDataset(x, x @ torch.randn(16, 4, generator=gen))
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))


def loss_of(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(batch[0]), batch[1])


if args.far:  # speed-planned rounds (adaptive), pseudo-gradients as int8, trusted
    modes = {"sync": potluck.DiLoCo(inner_steps=args.rounds, codec=Int8Blockwise()),
             "trust": potluck.Trust()}
else:
    modes = {"comm_hook": CompressedSum(Int8Blockwise()),
             "trust": potluck.Trust(spot_check=potluck.trust.SpotCheck(loss_of))}
opt_inner = torch.optim.AdamW(net.parameters(), lr=3e-3)
model, opt, loader = potluck.prepare(net, opt_inner, data, global_batch=48, timeout=20,
                                     checkpoint_dir=args.checkpoint_dir, **modes)
opt.leave_on_sigterm()
while loader.epoch < args.epochs and not opt.left:
    losses = []
    for batch in loader:
        opt.zero_grad()
        loss = loss_of(model, batch)
        loss.backward()
        opt.step()
        opt.report(loss=loss.item())
        losses.append(loss.item())
    if opt.cohort.rank == 0 and not opt.left:  # (the mean of this worker's batches)
        print(f"epoch {loader.epoch - 1}: loss {sum(losses) / len(losses):.4f}, "
              f"{opt.steps} steps, {opt.cohort.world_size} workers", flush=True)
opt.finish()
