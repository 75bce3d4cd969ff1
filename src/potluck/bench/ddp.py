"""potluck.DataParallel vs torch DDP: median step time, same models, one run, interleaved.

Two ranks on Gloo, one torch thread each. Both wrappers train identical copies of the
model on the same batches; blocks of steps alternate between them (ABBA), so drift in
the machine's speed hits both alike. Reported: median step time of each and the ratio
potluck / torch (below 1.00 means potluck is faster).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from torch import nn

from potluck.bench import models
from potluck.bench.common import interleaved, median, table, write_json
from potluck.harness.ranks import run_ranks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="mlp,transformer",
                        help="comma-separated subset of: mlp, transformer")
    parser.add_argument("--world-size", type=int, default=2,
                        help="local processes per contender, at least 2 (default 2)")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per block")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0,
                        help="gradient bucket size in MB, the same for both contenders "
                             "(default 25, torch DDP's)")
    parser.add_argument("--quick", action="store_true", help="a short run (< 60 s)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")


def main(args: argparse.Namespace) -> int:
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(names) - set(_WORKLOADS))
    if unknown or not names:
        raise SystemExit(f"potluck bench ddp: unknown model(s) {unknown}; "
                         f"choose from {sorted(_WORKLOADS)}")
    if args.world_size < 2:
        raise SystemExit(f"potluck bench ddp: --world-size must be >= 2, got {args.world_size}")
    rounds, steps = (4, 2) if args.quick else (args.rounds, args.steps)
    results = []
    for name in names:
        per_rank = run_ranks(_rank_main, args.world_size, name, rounds, steps,
                             args.bucket_cap_mb, timeout=600)
        times = per_rank[0]
        ours, theirs = median(times["potluck"]), median(times["torch"])
        results.append({"model": name, "params_m": times["params"] / 1e6,
                        "potluck_step_s": ours, "torch_step_s": theirs,
                        "ratio": ours / theirs, "steps_each": len(times["potluck"])})
    print(f"potluck bench ddp: {args.world_size} ranks, gloo, 1 thread per rank, "
          f"{rounds} interleaved rounds x {steps} steps")
    print(table(["model", "params (M)", "potluck step (s)", "torch step (s)",
                 "ratio potluck/torch"],
                [[r["model"], r["params_m"], r["potluck_step_s"], r["torch_step_s"],
                  r["ratio"]] for r in results]))
    if args.json:
        write_json(args.json, {"world_size": args.world_size, "results": results})
    return 0


def _mlp_workload() -> tuple[nn.Module, Any]:
    def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        return torch.randn(32, 512, generator=gen), torch.randn(32, 512, generator=gen)

    return models.mlp(), batch


def _transformer_workload() -> tuple[nn.Module, Any]:
    def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        tokens = torch.randint(0, 4096, (8, 65), generator=gen)
        return tokens[:, :-1], tokens[:, 1:]

    return models.TinyLM(), batch


_WORKLOADS = {"mlp": _mlp_workload, "transformer": _transformer_workload}


def _loss(name: str, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if name == "transformer":
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
    return nn.functional.mse_loss(out, target)


def _rank_main(rank: int, world_size: int, name: str, rounds: int, steps: int,
               bucket_cap_mb: float) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    from potluck import DataParallel

    torch.manual_seed(0)
    module, batch = _WORKLOADS[name]()
    twin, _ = _WORKLOADS[name]()
    twin.load_state_dict(module.state_dict())
    wrapped: dict[str, torch.nn.Module] = {
        "potluck": DataParallel(module, bucket_cap_mb=bucket_cap_mb),
        "torch": TorchDDP(twin, bucket_cap_mb=bucket_cap_mb),
    }
    optims = {k: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
              for k, m in wrapped.items()}
    times: dict[str, Any] = {"potluck": [], "torch": [],
                             "params": models.parameter_count(module)}
    step = 0
    for warmup in (True, False):  # warm-up: buckets rebuilt, allocator and caches warm
        for contender in interleaved(list(wrapped), 1 if warmup else rounds):
            model, opt = wrapped[contender], optims[contender]
            for _ in range(2 if warmup else steps):
                x, y = batch(step, rank)
                step += 1
                start = time.perf_counter()
                opt.zero_grad()
                _loss(name, model(x), y).backward()  # type: ignore[no-untyped-call]
                opt.step()
                if not warmup:
                    times[contender].append(time.perf_counter() - start)
    return times
