"""The ``potluck`` command: argparse subcommands only (parse -> config -> call)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="potluck",
        description="Distributed data-parallel training for PyTorch on uneven GPUs.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    from potluck.launch import cli as launch_cli

    launch_cli.add_arguments(sub.add_parser("run", help="launch a training script on N workers"))

    bench = sub.add_parser("bench", help="side-by-side benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    try:  # the bench modules land on their own branch; `run` must work without them
        from potluck.bench import allreduce as bench_allreduce  # type: ignore[attr-defined]
        from potluck.bench import ddp as bench_ddp  # type: ignore[attr-defined]
    except ImportError:
        return parser

    bench_ddp.add_arguments(bench_sub.add_parser("ddp", help=bench_ddp.__doc__))
    bench_allreduce.add_arguments(
        bench_sub.add_parser("allreduce", help=bench_allreduce.__doc__)
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command == "run":
        from potluck.launch import cli as launch_cli

        return launch_cli.main(args)
    if args.command == "bench":
        from potluck.bench import allreduce as bench_allreduce  # type: ignore[attr-defined]
        from potluck.bench import ddp as bench_ddp  # type: ignore[attr-defined]

        runner = {"ddp": bench_ddp.main, "allreduce": bench_allreduce.main}[args.bench]
        return int(runner(args))
    parser.error(f"unknown command {args.command!r}")
    return 2
