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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command == "demo":
        from potluck.demo import cli as demo_cli

        return demo_cli.main(args)
    parser.error(f"unknown command {args.command!r}")
    return 2
