"""One rank of ``potluck bench plan``: a fixed MLP job, every step or DiLoCo, timed.

Started by the bench in a host's network namespace with ``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` and ``GLOO_SOCKET_IFNAME`` set. It imports
torch and builds its model first, then writes ``--ready`` and waits for ``--go``: in
between the bench puts the process under its CPU quota, so the import runs at full
speed and every timed step under the quota. Then it trains ``--periods`` steps (or
rounds of ``--inner-steps`` global batches) with ``potluck.prepare`` (balanced shares
every step; local steps by speed in rounds) and writes, on rank 0, the time of each
commit and its samples to ``--out``; in rounds every rank writes, beside it in
``rounds-<rank>.json``, each round's local compute, wait and sync seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

WIDTH, DEPTH, FEATURES, CLASSES = 512, 3, 64, 10
SAMPLES = 16384


def mlp_parameters(width: int = WIDTH, depth: int = DEPTH) -> int:
    sizes = [FEATURES, *[width] * depth, CLASSES]
    return sum(a * b + b for a, b in itertools.pairwise(sizes))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m potluck_lab.bench.plan_job")
    p.add_argument("--mode", choices=("step", "diloco"), required=True)
    p.add_argument("--periods", type=int, required=True, help="steps, or rounds")
    p.add_argument("--inner-steps", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=1024)
    p.add_argument("--ready", type=Path, required=True)
    p.add_argument("--go", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)

    import torch
    from torch.utils.data import TensorDataset

    import potluck
    from potluck.env import read_worker_env
    from potluck_lab.models import mlp

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(SAMPLES, FEATURES, generator=gen),
                         torch.randint(0, CLASSES, (SAMPLES,), generator=gen))
    net = mlp([FEATURES, *[WIDTH] * DEPTH, CLASSES], torch.nn.ReLU, seed=0)
    a.ready.write_text(str(os.getpid()))
    while not a.go.exists():
        time.sleep(0.005)
    inner = torch.optim.AdamW(net.parameters(), lr=1e-3)
    sync = potluck.DiLoCo(inner_steps=a.inner_steps) if a.mode == "diloco" else None
    model, opt, loader = potluck.prepare(net, inner, data, global_batch=a.global_batch,
                                         sync=sync, balance=a.mode == "step" or None)
    from potluck.sync import DiLoCoSync

    strategy = opt.part(DiLoCoSync)
    commits: list[list[float]] = []
    rounds: list[list[float]] = []
    while len(commits) < a.periods:
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            before = opt.steps
            opt.step()
            if opt.steps != before:
                samples = a.global_batch * (a.inner_steps if sync else 1)
                commits.append([time.perf_counter(), float(samples)])
                record = strategy.last if strategy is not None else None
                if record is not None:
                    rounds.append([record.compute_s, record.wait_s, record.sync_s])
            if len(commits) >= a.periods:
                break
    opt.finish()
    rank = read_worker_env().rank
    if rounds:
        (a.out.parent / f"rounds-{rank}.json").write_text(json.dumps(rounds))
    if rank == 0:
        a.out.write_text(json.dumps({"commits": commits}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
