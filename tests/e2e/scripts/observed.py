"""A training script for the status page's tests: trains until a stop file appears.

``--slow RANKS``: a comma list; trial i (steps i*M .. i*M + M - 1, M = ``--trial-steps``)
sleeps ``--slow-ms`` inside the backward of the rank named i-th (after the list: none). The
sleep sits in a gradient hook of the first layer, so it counts as that rank's compute.
``--checkpoint-dir D --checkpoint-every K``: a checkpoint every K steps, and a (re)started
job resumes from the newest one.

Every rank stops after the same step: the first step in which any rank saw the stop
file. Each rank feeds "I saw it" into the gradient of a scalar parameter, so the step's
own (plain or weighted) average tells every rank alike; a step whose all-reduce failed
leaves no gradients, and its redo decides afresh.
A step number written into the file could not do that: a rank one step ahead would
already be past it, and ranks that see the file one check apart would stop one step
apart, leaving the last one's all-reduce without a peer.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

import potluck


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--max-steps", type=int, default=5000)
    parser.add_argument("--slow", default="")
    parser.add_argument("--trial-steps", type=int, default=10)
    parser.add_argument("--slow-ms", type=float, default=40.0)
    parser.add_argument("--step-ms", type=float, default=0.0)
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    args = parser.parse_args()
    schedule = [int(r) for r in args.slow.split(",") if r]

    torch.manual_seed(0)
    net = Observed()
    data = torch.utils.data.TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
    sgd = torch.optim.SGD(net.parameters(), lr=0.01)
    model, opt, loader = potluck.prepare(net, sgd, data, global_batch=24,
                                         checkpoint_dir=args.checkpoint_dir,
                                         resume=args.checkpoint_dir is not None)
    checkpoints = (potluck.CheckpointManager(args.checkpoint_dir, rank=opt.cohort.rank)
                   if args.checkpoint_every and args.checkpoint_dir else None)
    cohort_rank = lambda: opt.cohort.rank  # noqa: E731

    def slow_down(grad: torch.Tensor) -> torch.Tensor:
        trial = opt.steps // args.trial_steps
        if trial < len(schedule) and schedule[trial] == cohort_rank():
            time.sleep(args.slow_ms / 1000)
        return grad

    net.layers[0].weight.register_hook(slow_down)
    stop = Path(args.stop_file)
    stopping = False
    while opt.steps < args.max_steps and not stopping:
        for x, y in loader:
            out, seen = model(x, torch.tensor(float(stop.exists())))
            loss = ((out - y) ** 2).mean()
            (loss + seen).backward()
            opt.report(loss=loss.item())
            opt.step()
            stopping = bool(net.seen.grad is not None and float(net.seen.grad) > 0)
            opt.zero_grad()
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            if checkpoints is not None and opt.steps % args.checkpoint_every == 0:
                checkpoints.save(opt.steps, opt.state_dict())
            if stopping or opt.steps >= args.max_steps:
                break
    opt.finish()


class Observed(nn.Module):
    """The trained MLP, and ``seen``: a scalar whose gradient is the step's mean of the
    ranks' "I saw the stop file" (its value stays 0 until then, so the loss is the
    MLP's)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
        self.seen = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor, saw_stop: torch.Tensor) -> tuple[torch.Tensor,
                                                                           torch.Tensor]:
        return self.layers(x), self.seen * saw_stop


if __name__ == "__main__":
    main()
