"""The job of ``potluck bench plan --swap``: a worker of ``potluck run --elastic``.

An MLP of about 100k parameters (0.4 MB of gradients, so a capped link shows) trains
``--steps`` steps of ``--global-batch`` samples, one epoch. Each worker writes into
``--trace DIR``, under ``node<N>-<pid>``: ``.jsonl``, the samples of each committed
step (``potluck.testing.SampleLedger``), and ``.times``, a JSON line per committed step
(``{"step": n, "at": t, "world": w}``); ``.hello``, once it starts to join.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from potluck_lab.models import mlp

WIDTH = 256
FEATURES = 64


def main(argv: list[str] | None = None) -> None:
    import potluck
    from potluck.testing import SampleLedger

    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=90)
    parser.add_argument("--global-batch", type=int, default=96)
    parser.add_argument("--timeout", type=float, default=30.0, help="collective timeout")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    samples = args.steps * args.global_batch
    gen = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(samples, FEATURES, generator=gen),
                                          torch.randn(samples, FEATURES, generator=gen),
                                          torch.arange(samples))
    net = mlp([FEATURES, WIDTH, WIDTH, FEATURES], seed=0)
    sgd = torch.optim.SGD(net.parameters(), lr=0.01)
    stem = args.trace / f"node{os.environ.get('GROUP_RANK', '0')}-{os.getpid()}"
    stem.with_suffix(".hello").touch()  # (a spare waits inside prepare)
    model, opt, loader = potluck.prepare(net, sgd, data, global_batch=args.global_batch,
                                         seed=1, timeout=args.timeout)
    with SampleLedger(stem.with_suffix(".jsonl")) as ledger, \
            stem.with_suffix(".times").open("a") as times:
        for x, y, ids in loader:
            epoch, before = loader.epoch, opt.steps
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
            opt.step()
            if opt.steps > before:
                ledger.record(epoch, ids.tolist())
                times.write(json.dumps({"step": opt.steps, "at": time.time(),
                                        "world": opt.cohort.world_size}) + "\n")
                times.flush()
    opt.finish()


if __name__ == "__main__":
    main()
