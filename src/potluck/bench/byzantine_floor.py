"""The trust bench's floor: what the step's collectives cost alone, in raw torch.

One rank of ``potluck bench byzantine``'s floor timing: the trust bench's model and data
(``byzantine_job``), each rank's part of the global batch, SGD with momentum, and the
gradient (one flat buffer, as one bucket) synchronized either by one all-reduce (the
plain mean's structure) or by two all-to-alls with a plain mean of the owner's slice in
between (trust's structure: each owner gets every rank's copy of its slice, then hands
every rank its result). No potluck code in the step: the difference between the two is
what the design's communication costs on the machine, and the gap from there to
potluck's own step times is potluck's work, not the wire's.

The ``robust*`` modes add, in the same raw torch, the least work trust's checks need,
to tell what the design costs on the machine from what potluck's code adds to it:

- ``robust``: the owner's slice aggregated by CenteredClip's clean case (the lower
  median, by trust's own kernel, the one piece of potluck code in the step; each
  copy's distance from it; the weighted mean; each copy's distance from that, all
  within the radius), the distances handed back with the aggregate, a fingerprint of
  the parameters (two wrapping 32-bit sums a tensor) riding with them, the replay
  watch's sum of each copy received, and a keyed BLAKE3 digest of each owner's
  aggregate as handed out;
- ``robust_audit``: also, every step, one owner's slice audited: every rank's copy of
  it rides along in the first all-to-all, and every other owner recomputes that
  owner's aggregate and compares it with the one handed out;
- ``robust_spot1`` and ``robust_spot3``: also, one step in ``SPOT_EVERY``, one rank's
  gradient recomputed on its own samples from the step's parameters (a snapshot taken
  before the update) and compared on the checker's slice, by one other owner or by
  all three others (as trust's spot checks do).

Every decision is taken as the clean case's (nobody is clipped, nothing differs): the
floor times the work, not the verdicts.
"""

from __future__ import annotations

import time
from typing import Any

import blake3
import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from potluck.bench.byzantine_job import GLOBAL_BATCH, HIDDEN, SPOT_EVERY, data, model
from potluck.trust.aggregate import lower_median

MODES = ("allreduce", "alltoall", "robust", "robust_audit", "robust_spot1", "robust_spot3")
TAU_SCALE = 2.0  # CenteredClip's default
_KEY = bytes(32)  # (trust's key is drawn after the step; its value costs nothing)


def run_floor(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec``: mode (``MODES``), steps, hidden (the model's width). Runs on the
    default group (``harness.ranks.run_ranks(init_group=True)``); returns the step
    times (seconds) and the parameters at the end, flat."""
    mode, steps = spec["mode"], int(spec["steps"])
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    train, _ = data(steps)
    net = model(0, spec.get("hidden", HIDDEN))
    shadow = model(0, spec.get("hidden", HIDDEN))  # the spot check's snapshot
    params = list(net.parameters())
    optimizer = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    numel = sum(p.numel() for p in params)
    piece = -(-numel // world_size)
    flat = torch.zeros(piece * world_size)
    received = torch.empty_like(flat)
    extra = world_size + 2  # the distances and the fingerprint (two words as floats)
    back = torch.empty(world_size * (piece + extra))
    width = piece * (1 if mode in ("allreduce", "alltoall", "robust") else 2)
    lanes, arrived = torch.empty(world_size, width), torch.empty(world_size, width)
    words = [p.detach().view(torch.int32).reshape(-1) for p in params]
    part = GLOBAL_BATCH // world_size
    x_all, y_all = train.tensors
    times: list[float] = []
    for step in range(steps):
        start = step * GLOBAL_BATCH + rank * part
        xb, yb = x_all[start:start + part], y_all[start:start + part]
        began = time.perf_counter()
        optimizer.zero_grad()
        spot = mode.startswith("robust_spot") and step % SPOT_EVERY == 0
        if spot:  # the step's parameters, before the update
            with torch.no_grad():
                torch._foreach_copy_(list(shadow.parameters()), list(params))
        nn.functional.cross_entropy(net(xb), yb).backward()  # type: ignore[no-untyped-call]
        torch.cat([_grad(p).reshape(-1) for p in params], out=flat[:numel])
        if mode == "allreduce":
            dist.all_reduce(flat)
            flat.div_(world_size)
        elif mode == "alltoall":
            dist.all_to_all_single(received, flat)
            mean = received.view(world_size, piece).mean(0)
            dist.all_to_all_single(flat, mean.repeat(world_size))
        else:
            audit = mode != "robust"  # one owner's slice of every rank's copy rides along
            owner = step % world_size
            lanes[:, :piece].copy_(flat.view(world_size, piece))
            if audit:
                lanes[:, piece:].copy_(flat[owner * piece:(owner + 1) * piece])
            dist.all_to_all_single(arrived, lanes)
            copies = arrived[:, :piece]
            mine, d2 = _clip_clean(copies)
            sums = [int(w.sum(dtype=torch.int32)) for w in words]  # the fingerprint
            folded = 0
            for value in sums:
                folded = (folded * 1_000_003 + (value & 0xFFFFFFFF)) & ((1 << 63) - 1)
            row = torch.cat([mine, d2, torch.tensor([folded >> 32, folded & 0xFFFFFFFF],
                                                    dtype=flat.dtype)])
            dist.all_to_all_single(back, row.repeat(world_size))
            rows = back.view(world_size, piece + extra)
            [int(c.view(torch.int32).sum(dtype=torch.int32)) for c in copies]  # replays
            for row_of in rows:  # each owner's aggregate as handed out, keyed
                blake3.blake3(row_of[:piece].numpy().view(np.uint8), key=_KEY).digest(8)
            if audit and rank != owner:  # the other owners recompute its aggregate
                again, _ = _clip_clean(arrived[:, piece:])
                float((again - rows[owner, :piece]).abs().max())
            flat.view(world_size, piece).copy_(rows[:, :piece])
            received = copies
            if spot:
                _spot(shadow, received, rank, world_size, step, piece, numel,
                      x_all, y_all, part, checkers=1 if mode == "robust_spot1" else 3)
        offset = 0
        for p in params:
            _grad(p).view(-1).copy_(flat[offset:offset + p.numel()])
            offset += p.numel()
        optimizer.step()
        times.append(time.perf_counter() - began)
    return {"times": times, "parameters": torch.cat([p.detach().reshape(-1) for p in params])}


def _clip_clean(copies: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CenteredClip's clean case on equal weights: the weighted mean, once every copy is
    found within the clip radius of it (the floor takes no other case), and each copy's
    squared distance to it."""
    center = lower_median(copies)  # (torch.median along dim 0 takes 30 times as long)
    spread = sorted((copies - center).norm(dim=1).tolist())
    tau = TAU_SCALE * spread[(len(spread) - 1) // 2]
    mean = copies.mean(0)
    offsets = (copies - mean).norm(dim=1)
    if float(offsets.max()) > tau:
        raise RuntimeError("the floor's clean step clipped a copy")
    return mean, offsets.square()


def _spot(shadow: nn.Module, received: torch.Tensor, rank: int,
          world_size: int, step: int, piece: int, numel: int, x_all: torch.Tensor,
          y_all: torch.Tensor, part: int, checkers: int) -> None:
    """One target (``step // SPOT_EVERY`` round the ranks) spot-checked by ``checkers``
    of the other ranks: its gradient recomputed from the snapshot on its own samples,
    compared on the checker's slice with the copy it sent."""
    target = (step // SPOT_EVERY) % world_size
    others = [r for r in range(world_size) if r != target][:checkers]
    if rank not in others:
        return
    start = step * GLOBAL_BATCH + target * part
    for p in shadow.parameters():
        p.grad = None
    nn.functional.cross_entropy(shadow(x_all[start:start + part]),
                                y_all[start:start + part]).backward()  # type: ignore[no-untyped-call]
    again = torch.cat([_grad(p).reshape(-1) for p in shadow.parameters()])
    ours = again[rank * piece:min((rank + 1) * piece, numel)]
    sent = received[target][:ours.numel()]
    float((ours - sent).norm() / sent.norm().clamp_min(1e-30))


def _grad(param: torch.Tensor) -> torch.Tensor:
    if param.grad is None:  # every parameter of the bench's MLP is used
        raise RuntimeError("the floor's model has a parameter without a gradient")
    return param.grad
