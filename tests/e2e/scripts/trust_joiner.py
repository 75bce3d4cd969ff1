"""An elastic job with trust comparing fingerprints every 3 steps and spot-checking one
step in 2, where local rank 2 crashes once (after step ``--crash-at``) and its launcher
restarts it as a new member that joins with the live state. The gradients travel in
three buckets, so the survivors find the peer lost while one bucket's aggregation waits
for the next bucket's call. Every worker trains to step ``--steps`` and prints its
strikes, events, the spot checks it ran and any it could not (trust's log), and its
parameters' fingerprint; rank 0 saves its parameters to ``--out``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
from _trust_toy import toy_job

import potluck
from potluck.trust import TrustPart
from potluck.trust.fingerprint import fingerprint

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--crash-at", type=int, default=8)
parser.add_argument("--crashed", type=Path, required=True)  # written by the crash
parser.add_argument("--out", type=Path, required=True)
args = parser.parse_args()


class SpotLog(logging.Handler):
    """Counts trust's lines on spot checks: each one run (a debug line), and a picked
    one that could not run (a warning, also printed)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.ran = self.unchecked = 0

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        self.ran += "trust: spot check of rank" in text
        self.unchecked += "not checked" in text
        if record.levelno >= logging.WARNING:
            print(text, file=sys.stderr, flush=True)


def loss(module: Any, batch: Any) -> torch.Tensor:
    return torch.nn.functional.mse_loss(module(batch[0]), batch[1])


spots = SpotLog()
logging.getLogger("potluck.trust.part").addHandler(spots)
logging.getLogger("potluck.trust.part").setLevel(logging.DEBUG)
data, net = toy_job()
trust = potluck.Trust(fingerprint_every=3,
                      spot_check=potluck.trust.SpotCheck(loss, every=2))
model, opt, loader = potluck.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05), data,
                                     global_batch=36, trust=trust,
                                     # three buckets: the survivors find the lost peer
                                     # while a bucket's aggregation is still pending
                                     bucket_cap_mb=0.0001, first_bucket_cap_mb=0.0001)
part = opt.part(TrustPart)
assert part is not None
crasher = int(os.environ["LOCAL_RANK"]) == 2 and not args.crashed.exists()
while opt.steps < args.steps:
    for xb, yb in loader:
        opt.zero_grad()
        loss(model, (xb, yb)).backward()
        opt.step()
        if crasher and opt.steps == args.crash_at:
            args.crashed.write_text(str(opt.steps))
            sys.stderr.flush()
            os._exit(1)  # a worker lost mid-run (the test's fault, not a way to end)
        if opt.steps >= args.steps:
            break
strikes = [f"{e.member}:{e.kind}@{e.step}" for e in part.strikes.evidence]
print(f"worker done after step {opt.steps}: {opt.cohort.world_size} workers; strikes "
      f"{strikes}; events {[e['event'] for e in part.events]}; spot checks {spots.ran} "
      f"run, {spots.unchecked} not; fingerprint "
      f"{fingerprint([p.data for p in net.parameters()]):#x}", file=sys.stderr, flush=True)
if opt.cohort.rank == 0:
    torch.save(net.state_dict(), args.out)
opt.finish()
