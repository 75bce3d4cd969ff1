"""An elastic job with trust on where local rank 3 sends sign-flipped gradients (with
``--diloco H``: rounds of H local steps, and it sends its pseudo-gradients x -10).

Once quarantined, the attacker tries to join again from the same seat and is refused
(it writes its pid and the refusal to ``--refused``); honest workers train until
2 s after it exited, then write their final parameters to ``--out``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _trust_toy import toy_job

import potluck
from potluck.errors import AdmissionError, QuarantinedError
from potluck.sync import DiLoCoSync
from potluck.sync.round_sum import Piece
from potluck.trust import TrustPart
from potluck.trust.round_part import RoundTrustPart
from potluck_lab.attacks import Attack

parser = argparse.ArgumentParser()
parser.add_argument("--refused", type=Path, required=True)
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--diloco", type=int, default=0)
args = parser.parse_args()


def sync() -> potluck.DiLoCo | None:
    return potluck.DiLoCo(args.diloco, adaptive=False) if args.diloco else None


data, net = toy_job()
model, opt, loader = potluck.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05), data,
                                     global_batch=32, trust=potluck.Trust(), sync=sync())
local_rank = int(os.environ["LOCAL_RANK"])
part: TrustPart | RoundTrustPart | None
if args.diloco:
    part, strategy = opt.part(RoundTrustPart), opt.part(DiLoCoSync)
    assert strategy is not None
    inner = strategy.round_sum

    def flipped(piece: Piece, group: Any) -> Any:
        if local_rank == 3:
            piece.delta.mul_(-10)
        return inner(piece, group)

    strategy.register_round_sum(flipped)
else:
    part = opt.part(TrustPart)
    assert part is not None
    model.register_comm_hook(None, Attack(part.exchange, "sign_flip", local_rank == 3))
assert part is not None


def agreed_stop() -> bool:
    """Every worker stops at the same step (one stopping alone breaks the others')."""
    global gone_at
    if gone_at is None and args.refused.exists() and not alive(args.refused.read_text()):
        gone_at = time.monotonic()
    # (2 s after the attacker's exit: time for its agent to restart it, if it would)
    over = gone_at is not None and time.monotonic() - gone_at > 2
    seen = torch.tensor([float(over or time.monotonic() > deadline)])
    return bool(opt.cohort.all_reduce_sum(seen).item() > 0)


def alive(refused: str) -> bool:
    try:
        os.kill(int(refused.split()[0]), 0)
    except ProcessLookupError:
        return False
    return True


def come_back(quarantined: QuarantinedError) -> None:
    """As a cheater would: join again from the same seat. Refused with the evidence."""
    try:
        potluck.prepare(toy_job()[1], torch.optim.SGD(net.parameters(), lr=0.05), data,
                        global_batch=32, trust=potluck.Trust(), cohort=potluck.init(),
                        sync=sync())
    except AdmissionError as refused:
        args.refused.write_text(f"{os.getpid()} {refused}")
        print(f"REFUSED: {refused}", file=sys.stderr, flush=True)
    raise quarantined  # (its launcher does not restart it: the seat is banned)


deadline = time.monotonic() + 100
gone_at: float | None = None  # when the refused attacker's process was seen gone
stop = False
while not stop:
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        try:
            opt.step()  # the attacker's raises QuarantinedError once it is out
        except QuarantinedError as out:
            come_back(out)
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
