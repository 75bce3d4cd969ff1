"""The trust bench's floor: what the step's collectives cost alone, in raw torch.

One rank of ``potluck bench byzantine``'s floor timing: the trust bench's model and data
(``byzantine_job``), each rank's part of the global batch, SGD with momentum, and the
gradient (one flat buffer, as one bucket) synchronized either by one all-reduce (the
plain mean's structure) or by two all-to-alls with a plain mean of the owner's slice in
between (trust's structure: each owner gets every rank's copy of its slice, then hands
every rank its result). No potluck code in the step: the difference between the two is
what the design's communication costs on the machine, and the gap from there to
potluck's own step times is potluck's work, not the wire's.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from potluck.bench.byzantine_job import GLOBAL_BATCH, HIDDEN, data, model

MODES = ("allreduce", "alltoall")


def run_floor(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec``: mode (``MODES``), steps, hidden (the model's width). Runs on the
    default group (``harness.ranks.run_ranks(init_group=True)``); returns the step
    times (seconds) and the parameters at the end, flat."""
    mode, steps = spec["mode"], int(spec["steps"])
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    train, _ = data(steps)
    net = model(0, spec.get("hidden", HIDDEN))
    params = list(net.parameters())
    optimizer = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    numel = sum(p.numel() for p in params)
    piece = -(-numel // world_size)
    flat = torch.zeros(piece * world_size)
    received = torch.empty_like(flat)
    part = GLOBAL_BATCH // world_size
    x_all, y_all = train.tensors
    times: list[float] = []
    for step in range(steps):
        start = step * GLOBAL_BATCH + rank * part
        xb, yb = x_all[start:start + part], y_all[start:start + part]
        began = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.cross_entropy(net(xb), yb).backward()  # type: ignore[no-untyped-call]
        torch.cat([_grad(p).reshape(-1) for p in params], out=flat[:numel])
        if mode == "allreduce":
            dist.all_reduce(flat)
            flat.div_(world_size)
        else:
            dist.all_to_all_single(received, flat)
            mean = received.view(world_size, piece).mean(0)
            dist.all_to_all_single(flat, mean.repeat(world_size))
        offset = 0
        for p in params:
            _grad(p).view(-1).copy_(flat[offset:offset + p.numel()])
            offset += p.numel()
        optimizer.step()
        times.append(time.perf_counter() - began)
    return {"times": times, "parameters": torch.cat([p.detach().reshape(-1) for p in params])}


def _grad(param: torch.Tensor) -> torch.Tensor:
    if param.grad is None:  # every parameter of the bench's MLP is used
        raise RuntimeError("the floor's model has a parameter without a gradient")
    return param.grad
