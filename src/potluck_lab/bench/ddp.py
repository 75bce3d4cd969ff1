"""potluck.DataParallel vs torch DDP: median step time, same models, one run, interleaved.

Two ranks on Gloo, one torch thread each. The wrappers train identical copies of the
model on the same batches; blocks of steps alternate between them, so drift in the
machine's speed hits all alike. Reported: median step time of each and the ratio
potluck / torch (below 1.00 means potluck is faster). A third contender is potluck with
the step observation on, as ``potluck run --status-port --metrics-dir`` runs it (the
observer as DataParallel's clock, a ``rank_step`` journal, pulses onto a store from a
thread): the ratio observed / plain is the instrumentation's cost.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._C._distributed_c10d import TCPStore

from potluck.errors import ConfigError
from potluck.metrics.observer import StepObserver
from potluck.metrics.publisher import JournalSink, StorePublisher, store_client
from potluck.reducer.clock import ComputeClock
from potluck.reducer.reducer import PassStats
from potluck.testing import run_ranks
from potluck_lab import models
from potluck_lab.common import at_least, interleaved, median, table
from potluck_lab.driver import Bench, drive


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


@dataclass(frozen=True)
class DdpConfig:
    models: tuple[str, ...]
    world_size: int
    rounds: int
    steps: int
    bucket_cap_mb: float


def check_args(args: argparse.Namespace) -> DdpConfig:
    """Flags -> config; raises ConfigError (exit 2) naming a bad flag."""
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(names) - set(_WORKLOADS))
    if unknown or not names:
        raise ConfigError(f"--models {args.models!r}: unknown model(s) {unknown}; choose "
                          f"from {', '.join(sorted(_WORKLOADS))}, e.g. --models mlp")
    at_least("--world-size", args.world_size, 2, "2")
    at_least("--rounds", args.rounds, 1, "8")
    at_least("--steps", args.steps, 1, "5")
    if not args.bucket_cap_mb > 0:
        raise ConfigError(f"--bucket-cap-mb {args.bucket_cap_mb:g} must be a positive size "
                          "in MB; use e.g. --bucket-cap-mb 25")
    rounds, steps = (4, 2) if args.quick else (args.rounds, args.steps)
    return DdpConfig(tuple(names), args.world_size, rounds, steps, args.bucket_cap_mb)


def main(args: argparse.Namespace) -> int:
    return drive(BENCH, args)


def measure(config: DdpConfig, logs: Path) -> list[dict[str, Any]]:
    """Per model: the three contenders' median step times and their ratios."""
    results = []
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # the agent's
    for name in config.models:
        per_rank = run_ranks(_rank_main, config.world_size, name, config.rounds, config.steps,
                             config.bucket_cap_mb, store.port, str(logs), timeout=600)
        times = per_rank[0]
        ours, theirs = median(times["potluck"]), median(times["torch"])
        observed = median(times["observed"])
        results.append({"model": name, "params_m": times["params"] / 1e6,
                        "potluck_step_s": ours, "torch_step_s": theirs,
                        "ratio": ours / theirs, "observed_step_s": observed,
                        "observe_ratio": observed / ours,
                        "steps_each": len(times["potluck"])})
    del store
    return results


def report_lines(config: DdpConfig, results: list[dict[str, Any]]) -> list[str]:
    return [f"potluck bench ddp: {config.world_size} ranks, gloo, 1 thread per rank, "
            f"{config.rounds} interleaved rounds x {config.steps} steps",
            table(["model", "params (M)", "potluck step (s)", "torch step (s)",
                   "ratio potluck/torch", "observed step (s)", "ratio observed/plain"],
                  [[r["model"], r["params_m"], r["potluck_step_s"], r["torch_step_s"],
                    r["ratio"], r["observed_step_s"], r["observe_ratio"]] for r in results])]


def _mlp_workload() -> tuple[nn.Module, Any]:
    def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        return torch.randn(32, 512, generator=gen), torch.randn(32, 512, generator=gen)

    return models.wide_mlp(), batch


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
               bucket_cap_mb: float, store_port: int, journals: str) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    from potluck import DataParallel

    torch.manual_seed(0)
    module, batch = _WORKLOADS[name]()
    twin, _ = _WORKLOADS[name]()
    twin.load_state_dict(module.state_dict())
    third, _ = _WORKLOADS[name]()
    third.load_state_dict(module.state_dict())
    observed = _observer(rank, world_size, store_port, journals,
                         lambda: on.reducer.last_pass)
    on = DataParallel(third, bucket_cap_mb=bucket_cap_mb, clock=observed)
    wrapped: dict[str, torch.nn.Module] = {
        "potluck": DataParallel(module, bucket_cap_mb=bucket_cap_mb),
        "torch": TorchDDP(twin, bucket_cap_mb=bucket_cap_mb),
        "observed": on,
    }
    optims = {k: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
              for k, m in wrapped.items()}
    times: dict[str, Any] = {"potluck": [], "torch": [], "observed": [],
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
                if contender == "observed":  # what the step transaction tells it
                    observed.step_started()
                    opt.step()
                    observed.committed(step)
                else:
                    opt.step()
                if not warmup:
                    times[contender].append(time.perf_counter() - start)
    observed.close()
    return times


def _observer(rank: int, world_size: int, store_port: int, journals: str,
              passes: Callable[[], PassStats]) -> StepObserver:
    """The observation ``potluck.prepare`` sets up under ``--status-port --metrics-dir``."""
    def where() -> tuple[int, int, int]:
        return rank, world_size, 0

    observer = StepObserver(ComputeClock(), where, passes, samples=lambda: (32, 32 * world_size),
                            sinks=[JournalSink(journals)])
    observer.add_sink(StorePublisher(store_client("127.0.0.1", store_port), "bench",
                                     observer.worker, position=observer.position,
                                     where=where).start())
    return observer


BENCH = Bench("ddp", check_args, measure, report_lines,
              lambda config, results: {"world_size": config.world_size, "results": results})
