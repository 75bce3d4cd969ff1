"""The job of ``potluck bench plan --swap``: a worker of ``potluck run --elastic``.

An MLP of about 100k parameters (0.4 MB of gradients, so a capped link shows) trains
``--steps`` steps of ``--global-batch`` samples, one epoch. Each worker writes into
``--trace DIR``, under ``node<N>-<pid>``: ``.jsonl``, the samples of each committed
step (``potluck.testing.SampleLedger``), and ``.times``, a JSON line per committed step
(``{"step": n, "at": t, "world": w}``); ``.hello``, once it starts to join. A founder
trains once ``--hellos`` workers said hello (so the spare waits before the cohort
trains, however slowly its process started); rank 0 touches ``spare.queued`` once a
spare waits to be admitted. Each swap check is logged (INFO).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable
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
    parser.add_argument("--hellos", type=int, default=1, help="workers to await")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("potluck.population").setLevel(logging.INFO)  # (each check)
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
    _await(lambda: len(list(args.trace.glob("*.hello"))) >= args.hellos, limit=120.0)
    queued = args.trace / "spare.queued"
    with SampleLedger(stem.with_suffix(".jsonl")) as ledger, \
            stem.with_suffix(".times").open("a") as times:
        for x, y, ids in loader:
            if opt.cohort.rank == 0 and not queued.exists() and opt.cohort.spares():
                queued.touch()  # (the bench throttles once a spare waits)
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


def _await(done: Callable[[], bool], limit: float) -> None:
    deadline = time.monotonic() + limit
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other workers did not start within {limit:g} s")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
