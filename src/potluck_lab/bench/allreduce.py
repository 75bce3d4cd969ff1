"""Bus bandwidth of the reducer's bucketed all-reduce vs one raw c10d all-reduce.

For each message size, the same bytes are averaged two ways, interleaved: (a) through
potluck's Reducer (gradients of 8 parameters in bucket views, the default hook, the
unused-parameter bitmap: everything a training step pays) and (b) one raw
``ProcessGroup.allreduce`` of a flat tensor of that size. Bus bandwidth follows the
ring cost model: 2 (N-1) / N * bytes / seconds.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from potluck.errors import ConfigError
from potluck.testing import run_ranks
from potluck_lab.common import at_least, interleaved, median, table
from potluck_lab.driver import Bench, drive

_DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"
_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default=_DEFAULT_SIZES,
                        help=f"message sizes in bytes (K/M suffixes), default {_DEFAULT_SIZES}")
    parser.add_argument("--world-size", type=int, default=2,
                        help="local processes taking part in each all-reduce (default 2)")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds per size")
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")


def parse_size(text: str) -> int:
    """'64K' -> 65536; a plain number is bytes."""
    text = text.strip().upper().removesuffix("B")
    scale = _UNITS.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in _UNITS else text
    try:
        value = int(float(digits) * scale)
    except ValueError:
        raise ConfigError(
            f"--sizes: bad size {text!r}; use sizes like 4K, 1M or 65536 (bytes)"
        ) from None
    if value < 32:
        raise ConfigError(f"--sizes: size {text!r} is below 32 bytes, the smallest measured; "
                          "use e.g. 64 or 4K")
    return value


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> float:
    """Bytes per second each link carries in a ring all-reduce of ``nbytes``."""
    return 2 * (world_size - 1) / world_size * nbytes / seconds


@dataclass(frozen=True)
class AllreduceConfig:
    sizes: tuple[int, ...]  # bytes
    world_size: int
    rounds: int


def check_args(args: argparse.Namespace) -> AllreduceConfig:
    """Flags -> config; raises ConfigError (exit 2) naming a bad flag."""
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes:
        raise ConfigError(f"--sizes {args.sizes!r} names no size; use e.g. --sizes 4K,1M")
    at_least("--world-size", args.world_size, 2, "2")
    at_least("--rounds", args.rounds, 1, "6")
    return AllreduceConfig(tuple(sizes), args.world_size, 3 if args.quick else args.rounds)


def main(args: argparse.Namespace) -> int:
    return drive(BENCH, args)


def measure(config: AllreduceConfig, logs: Path) -> list[dict[str, Any]]:
    """Per size: the median time of each way and its bus bandwidth."""
    per_rank = run_ranks(_rank_main, config.world_size, list(config.sizes), config.rounds,
                         timeout=600)
    results = []
    for size in config.sizes:
        ours = median(per_rank[0][size]["potluck"])
        raw = median(per_rank[0][size]["raw"])
        bw_ours = bus_bandwidth(size, ours, config.world_size) / 1e9
        bw_raw = bus_bandwidth(size, raw, config.world_size) / 1e9
        results.append({"bytes": size, "potluck_s": ours, "raw_s": raw,
                        "potluck_busbw_gbs": bw_ours, "raw_busbw_gbs": bw_raw,
                        "ratio": bw_ours / bw_raw})
    return results


def report_lines(config: AllreduceConfig, results: list[dict[str, Any]]) -> list[str]:
    return [f"potluck bench allreduce: {config.world_size} ranks, gloo, float32, "
            f"median of {config.rounds} interleaved rounds",
            table(["size", "reducer (ms)", "raw (ms)", "reducer busbw (GB/s)",
                   "raw busbw (GB/s)", "bw ratio reducer/raw"],
                  [[_human(r["bytes"]), r["potluck_s"] * 1e3, r["raw_s"] * 1e3,
                    r["potluck_busbw_gbs"], r["raw_busbw_gbs"], r["ratio"]]
                   for r in results])]


def _human(nbytes: int) -> str:
    for unit, scale in (("M", 1024**2), ("K", 1024)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def _rank_main(rank: int, world_size: int, sizes: list[int], rounds: int) -> dict[int, Any]:
    from potluck.group import GroupHandle
    from potluck.reducer import Reducer, ReducerConfig

    group = dist.distributed_c10d._get_default_group()
    out: dict[int, Any] = {}
    for size in sizes:
        numel = size // 4
        pieces = [numel // 8] * 7 + [numel - 7 * (numel // 8)]
        params = [torch.nn.Parameter(torch.zeros(max(n, 1))) for n in pieces]
        reducer = Reducer(params, [f"p{i}" for i in range(8)], GroupHandle(group),
                          ReducerConfig())
        flat = torch.ones(numel)
        repeats = max(1, min(200, (8 * 1024 * 1024) // size))
        times: dict[str, list[float]] = {"potluck": [], "raw": []}
        for contender in interleaved(["potluck", "raw"], rounds + 1):
            for p in params:
                p.grad = torch.ones_like(p)
            group.barrier().wait()
            start = time.perf_counter()
            for _ in range(repeats):
                if contender == "potluck":
                    reducer.reduce_now()
                else:
                    group.allreduce([flat]).wait()
            times[contender].append((time.perf_counter() - start) / repeats)
        out[size] = {k: v[1:] for k, v in times.items()}  # first of each is warm-up
        reducer.remove_hooks()
    return out


BENCH = Bench("allreduce", check_args, measure, report_lines,
              lambda config, results: {"world_size": config.world_size, "results": results})
