"""In one process: the WAN bench's torch DDP run against two-replica Local SGD variants.

The WAN bench's workload (``potluck.bench.wan_data``: the demo's char transformer,
AdamW at the bench's lr, global batch 32, the same ``DataCursor`` order) without the
network: ``ddp`` trains one model on each global batch (what 2-rank DDP computes),
the others train two replicas on its halves and average their parameters on a
schedule, always after the last batch. Unlike the bench's potluck contenders: no
codec and no error feedback, each replica takes half of every global batch (potluck
hands each worker a contiguous part of the whole round's samples), and no even start
or adaptive split. The held-out loss after ``--steps`` batches is printed per data
seed; ``ddp`` at seed 1 reproduces the bench's DDP loss (1.7724).

    .venv/bin/python tools/local_sgd_sim.py VARIANT [--seeds 1,2,3] [--outer-lr 1.0]

VARIANT: ddp; every-H (a sync every H batches, e.g. every-125); ramp-F-H (sync after
F, then twice as many batches each round up to H); a suffix -m (Adam's first moment
averaged too at each sync) or -mv (both moments) on either.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F

from potluck.bench.wan_data import Windows, eval_batch, make_model
from potluck.data import DataCursor

CORPUS_CHARS = 400_000  # wan_job's default --corpus-chars


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def schedule(variant: str, steps: int) -> tuple[list[int], list[str]]:
    """The batches after which the replicas are averaged (always after the last one,
    so the loss is a synced model's), and the Adam state averaged with them."""
    parts = variant.split("-")
    state = {"m": ["exp_avg"], "mv": ["exp_avg", "exp_avg_sq"]}.get(parts[-1], [])
    if state:
        parts = parts[:-1]
    try:
        numbers = [int(x) for x in parts[1:]]
    except ValueError:
        numbers = []
    if not numbers or min(numbers) < 1 or (parts[0], len(numbers)) not in (
            ("every", 1), ("ramp", 2)):
        raise SystemExit(f"variant {variant!r}: ddp, every-H or ramp-F-H (H, F >= 1), "
                         "optionally ending in -m or -mv")
    if parts[0] == "every":
        syncs = list(range(numbers[0], steps + 1, numbers[0]))
    else:
        at, h, syncs = 0, numbers[0], []
        while at + h <= steps:
            at += h
            syncs.append(at)
            h = min(numbers[1], 2 * h)
    if not syncs or syncs[-1] != steps:
        syncs.append(steps)  # the last round is cut short
    return syncs, state


def run(variant: str, seed: int, steps: int, lr: float, outer_lr: float,
        data: Windows, held: tuple[torch.Tensor, torch.Tensor]) -> float:
    base = make_model(data.vocab_size)
    cursor = DataCursor(len(data), 32, seed=seed)
    if variant == "ddp":
        opt = torch.optim.AdamW(base.parameters(), lr=lr)
        for _ in range(steps):
            x, y = data.batch(cursor.rank_indices(0, [1.0]))
            opt.zero_grad()
            loss_of(base, x, y).backward()
            opt.step()
            cursor.commit()
        with torch.no_grad():
            return float(loss_of(base, *held))
    syncs, state = schedule(variant, steps)
    replicas = [copy.deepcopy(base) for _ in range(2)]
    opts = [torch.optim.AdamW(r.parameters(), lr=lr) for r in replicas]
    global_ = [p.detach().clone() for p in base.parameters()]
    for step in range(1, steps + 1):
        for k, (replica, opt) in enumerate(zip(replicas, opts, strict=True)):
            x, y = data.batch(cursor.rank_indices(k, [1.0, 1.0]))
            opt.zero_grad()
            loss_of(replica, x, y).backward()
            opt.step()
        cursor.commit()
        if step not in syncs:
            continue
        with torch.no_grad():
            params = zip(global_, *(r.parameters() for r in replicas), strict=True)
            for g, a, b in params:
                g.add_((a + b) / 2 - g, alpha=outer_lr)
                a.copy_(g)
                b.copy_(g)
                for key in state:
                    mean = (opts[0].state[a][key] + opts[1].state[b][key]) / 2
                    opts[0].state[a][key].copy_(mean)
                    opts[1].state[b][key].copy_(mean)
    with torch.no_grad():
        return float(loss_of(replicas[0], *held))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("variant")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--outer-lr", type=float, default=1.0)
    a = p.parse_args()
    torch.set_num_threads(1)
    data = Windows(CORPUS_CHARS)
    held = eval_batch(data)
    losses = [run(a.variant, int(s), a.steps, a.lr, a.outer_lr, data, held)
              for s in a.seeds.split(",")]
    print(a.variant, f"outer_lr={a.outer_lr}", [round(v, 4) for v in losses])


if __name__ == "__main__":
    main()
