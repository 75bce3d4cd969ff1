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

    from potluck.demo import cli as demo_cli

    demo_cli.add_arguments(sub.add_parser("demo", help="train a tiny model on 2 local workers"))

    bench = sub.add_parser("bench", help="side-by-side benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    from potluck.bench import allreduce as bench_allreduce
    from potluck.bench import ddp as bench_ddp

    bench_ddp.add_arguments(bench_sub.add_parser("ddp", help=bench_ddp.__doc__))
    bench_allreduce.add_arguments(
        bench_sub.add_parser("allreduce", help=bench_allreduce.__doc__)
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command == "demo":
        from potluck.demo import cli as demo_cli

        return demo_cli.main(args)
    if args.command == "bench":
        from potluck.bench import allreduce as bench_allreduce
        from potluck.bench import ddp as bench_ddp

        runner = {"ddp": bench_ddp.main, "allreduce": bench_allreduce.main}[args.bench]
        return runner(args)
    parser.error(f"unknown command {args.command!r}")
    return 2
