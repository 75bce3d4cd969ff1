"""The ``potluck`` command: argparse subcommands only (parse -> config -> call).

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``main(args) -> int``; this file only wires them together.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from potluck import __version__

# (command, module, help); bench subcommands are nested under "bench".
_COMMANDS = [
    ("run", "potluck.launch.cli", "launch a training script on N workers (torchrun-compatible)"),
    ("demo", "potluck.demo.cli", "train a tiny transformer on 2 local workers (the main job)"),
    ("plot", "potluck.metrics.plot_cli",
     "write PNG plots of a run (loss, throughput, compute vs wait, shares, events)"),
]
_BENCHES = [
    ("ddp", "potluck.bench.ddp", "potluck.DataParallel vs torch DDP, step time"),
    ("allreduce", "potluck.bench.allreduce", "bucketed vs raw all-reduce bus bandwidth"),
    ("chaos", "potluck.bench.chaos", "random kill / freeze / leave / join trials, checked"),
    ("faults", "potluck.bench.faults",
     "potluck elastic vs torchrun restart-from-checkpoint, a worker killed every T s"),
    ("straggler", "potluck.bench.straggler",
     "torch DDP vs potluck equal vs balanced shares, one worker held to a CPU quota"),
    ("byzantine", "potluck.bench.byzantine",
     "plain mean vs potluck trust, 4 workers with 1 attacker (6 attacks)"),
    ("wan", "potluck.bench.wan",
     "torch DDP (plain, fp16 hook) vs potluck DiLoCo over a rate-limited link"),
    ("loader", "potluck.bench.loader",
     "the loader's worker processes vs reading in the loop vs torch's DataLoader"),
]


def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """Every command is listed; only the one named in ``argv`` imports its module for
    its flags, so ``potluck --help`` and ``potluck run`` do not wait for torch."""
    named = [word for word in argv if not word.startswith("-")][:2]
    parser = argparse.ArgumentParser(
        prog="potluck",
        description="Distributed data-parallel training for PyTorch on uneven GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"potluck {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command, module, help_ in _COMMANDS:
        # No abbreviations: `potluck run script.py --metrics m` must hand --metrics to the
        # script, not take it for an abbreviation of run's --metrics-dir.
        command_parser = sub.add_parser(command, help=help_, description=help_,
                                        allow_abbrev=False)
        if named[:1] == [command]:
            _module(module).add_arguments(command_parser)
    bench = sub.add_parser("bench", help="side-by-side benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    for command, module, help_ in _BENCHES:
        command_parser = bench_sub.add_parser(command, help=help_, description=help_)
        if named == ["bench", command]:
            _module(module).add_arguments(command_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(words).parse_args(words)
    if args.command == "bench":
        return _bench(args)
    table = dict((c, m) for c, m, _ in _COMMANDS)
    result: int = _module(table[args.command]).main(args)
    return result


def _bench(args: argparse.Namespace) -> int:
    """Run one bench. A bad flag exits 2, as argparse's own errors do: the ``--json``
    path is checked here for every bench, before it runs (not after, when its results
    would be lost), and a bench's own checks raise ``ConfigError``."""
    from potluck.bench.common import check_json_path
    from potluck.errors import ConfigError

    module = dict((c, m) for c, m, _ in _BENCHES)[args.bench]
    try:
        check_json_path(getattr(args, "json", None))
        result: int = _module(module).main(args)
    except ConfigError as exc:
        print(f"potluck bench {args.bench}: {exc}", file=sys.stderr)
        return 2
    return result
