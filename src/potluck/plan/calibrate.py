"""``potluck plan --calibrate``: measure on this machine what the candidates file left
out.

- compute: samples a second of forward, backward and an optimizer step of the model
  (``--model module:function``; the function returns ``(model, sample)``, one input
  without its batch dimension), at the global batch's share of one worker;
- the reducer's overhead a step: two local ranks on Gloo over loopback train the model
  with ``potluck.DataParallel``; what a synchronized step takes beyond the same
  step without sync and a plain all-reduce of the gradients is the overhead (loopback
  is fast, so the all-reduce hides little: the figure is an upper bound);
- the all-reduce's CPU work per byte: the same two ranks all-reduce buffers of a
  quarter, half, one and two models' size, timing the process's CPU seconds; the
  least-squares slope over the bytes is the figure. Loopback moves large segments, so
  a real link's per-segment work is left out: the figure is a lower bound;
- a round's overhead: the pseudo-gradient and the outer step (Nesterov SGD) over the
  parameters, timed here.

A link's rate is not measured: the file gives each machine's.
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from potluck.errors import ConfigError

STEPS = 12  # timed steps per figure (after WARMUP)
WARMUP = 3


@dataclass(frozen=True)
class Calibration:
    parameters: int
    samples_per_s: float
    step_s: float
    round_s: float
    cpu_s_per_byte: float = 0.0


def factory(path: str) -> Callable[[], tuple[Any, Any]]:
    """``module:function`` as a callable; ConfigError with the fix if it is not one."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise ConfigError(f"--model {path!r}: give module:function, e.g. "
                          "mypkg.models:tiny (the function returns (model, sample))")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--model {path!r}: {exc}") from exc
    if not callable(found):
        raise ConfigError(f"--model {path!r} is not a function")
    return found  # type: ignore[no-any-return]


def calibrate(model_path: str, batch: int, ranks: bool = True) -> Calibration:
    """Every figure for the model at ``model_path``, ``batch`` samples a worker's step."""
    import torch

    torch.set_num_threads(1)
    model, sample = factory(model_path)()
    parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    compute = _median(_local_steps(model, sample, batch))
    step_s = cpu_s_per_byte = 0.0
    if ranks:
        from potluck.testing import run_ranks

        results = run_ranks(_overhead_rank, 2, model_path, batch, timeout=300)
        step_s = max(0.0, statistics.median(r[0] for r in results))
        cpu_s_per_byte = statistics.median(r[1] for r in results)
    return Calibration(parameters, batch / compute, step_s, _round_s(model), cpu_s_per_byte)


def _local_steps(model: Any, sample: Any, batch: int) -> list[float]:
    import torch

    inputs = sample.unsqueeze(0).expand(batch, *sample.shape).contiguous()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for _ in range(WARMUP + STEPS):
        began = time.perf_counter()
        opt.zero_grad()
        model(inputs).float().square().mean().backward()
        opt.step()
        times.append(time.perf_counter() - began)
    return times[WARMUP:]


def _round_s(model: Any) -> float:
    """The pseudo-gradient and a Nesterov outer step over ``model``'s parameters."""
    import torch

    params = [p.detach() for p in model.parameters()]
    anchor = [p.clone() for p in params]
    moment = [torch.zeros_like(p) for p in params]
    times = []
    for _ in range(WARMUP + STEPS):
        began = time.perf_counter()
        with torch.no_grad():
            for p, a, m in zip(params, anchor, moment, strict=True):
                delta = a - p
                m.mul_(0.9).add_(delta)
                a.sub_(delta.add(m, alpha=0.9), alpha=0.7)
                p.copy_(a)
        times.append(time.perf_counter() - began)
    return _median(times[WARMUP:])


def _overhead_rank(rank: int, world_size: int, model_path: str,
                   batch: int) -> tuple[float, float]:
    """One rank's synchronized step beyond its unsynchronized one and a plain
    all-reduce of its gradients; and the all-reduce's CPU seconds per byte."""
    import torch
    import torch.distributed as dist

    from potluck.reducer import DataParallel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, sample = factory(model_path)()
    wrapped = DataParallel(model)
    share = max(1, batch // world_size)
    inputs = sample.unsqueeze(0).expand(share, *sample.shape).contiguous()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))

    def step(sync: bool) -> float:
        began = time.perf_counter()
        opt.zero_grad()
        if sync:
            wrapped(inputs).float().square().mean().backward()
        else:
            with wrapped.no_sync():
                wrapped(inputs).float().square().mean().backward()
        opt.step()
        return time.perf_counter() - began

    synced = _median([step(True) for _ in range(WARMUP + STEPS)][WARMUP:])
    local = _median([step(False) for _ in range(WARMUP + STEPS)][WARMUP:])
    reduces = []
    for _ in range(WARMUP + STEPS):
        began = time.perf_counter()
        dist.all_reduce(flat)
        reduces.append(time.perf_counter() - began)
    points = []
    for scale in (0.25, 0.5, 1.0, 2.0):
        buffer = torch.zeros(max(1, int(flat.numel() * scale)))
        cpu = []
        for _ in range(WARMUP + STEPS):
            began = time.process_time()
            dist.all_reduce(buffer)
            cpu.append(time.process_time() - began)
        points.append((buffer.numel() * 4.0, _median(cpu[WARMUP:])))
    return synced - local - _median(reduces[WARMUP:]), slope(points)


def slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of ``points`` (x, y), at least 0."""
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    var = sum((x - mx) ** 2 for x, _ in points)
    return max(0.0, sum((x - mx) * (y - my) for x, y in points) / var) if var else 0.0


def _median(values: list[float]) -> float:
    return statistics.median(values)
