"""An elastic job with trust on where local rank 3 sends sign-flipped gradients.

Honest workers train until the restarted attacker has been refused (it writes
``--refused`` before it exits), then write their final parameters to ``--out``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from _trust_toy import toy_job

import potluck
from potluck.errors import AdmissionError
from potluck.harness.attacks import Attack
from potluck.trust import TrustPart

parser = argparse.ArgumentParser()
parser.add_argument("--refused", type=Path, required=True)
parser.add_argument("--out", type=Path, required=True)
args = parser.parse_args()

data, net = toy_job()
try:
    model, opt, loader = potluck.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05), data,
                                         global_batch=32, trust=potluck.Trust())
except AdmissionError as refused:
    args.refused.write_text(str(refused))
    print(f"REFUSED: {refused}", file=sys.stderr, flush=True)
    sys.exit(3)
local_rank = int(os.environ["LOCAL_RANK"])
part = opt.part(TrustPart)
assert part is not None
model.register_comm_hook(None, Attack(part.exchange, "sign_flip", local_rank == 3))


def agreed_stop() -> bool:
    """Every worker stops at the same step (one stopping alone breaks the others')."""
    seen = torch.tensor([float(args.refused.exists() or time.monotonic() > deadline)])
    return bool(opt.cohort.all_reduce_sum(seen).item() > 0)


deadline = time.monotonic() + 100
stop = False
while not stop:
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()  # the attacker's raises QuarantinedError once it is out
        time.sleep(0.01)
        stop = agreed_stop()
        if stop:
            break
quarantines = [e for e in part.events if e["event"] == "quarantine"]
print(f"worker done after step {opt.steps}: quarantined {[e['member'] for e in quarantines]}"
      f" at steps {[e['step'] for e in quarantines]}; {opt.cohort.world_size} workers",
      file=sys.stderr, flush=True)
if opt.cohort.rank == 0:
    torch.save(net.state_dict(), args.out)
opt.finish()
