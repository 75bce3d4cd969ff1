"""The ``potluck`` command: argparse subcommands only (parse -> config -> call).

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``main(args) -> int``; this file only wires them together.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Iterable, Sequence
from types import ModuleType

from potluck import __version__

# (command, module, help); bench subcommands are nested under "bench".
_COMMANDS = [
    ("run", "potluck.launch.cli", "launch a training script on N workers (torchrun-compatible)"),
    ("demo", "potluck_lab.demo.cli", "train a tiny transformer on 2 local workers (the main job)"),
    ("plot", "potluck.metrics.plot_cli",
     "write PNG plots of a run (loss, throughput, compute vs wait, shares, events)"),
]
_BENCHES = [
    ("ddp", "potluck_lab.bench.ddp", "potluck.DataParallel vs torch DDP, step time"),
    ("allreduce", "potluck_lab.bench.allreduce", "bucketed vs raw all-reduce bus bandwidth"),
    ("chaos", "potluck_lab.bench.chaos", "random kill / freeze / leave / join trials, checked"),
    ("faults", "potluck_lab.bench.faults",
     "potluck elastic vs torchrun restart-from-checkpoint, a worker killed every T s"),
    ("straggler", "potluck_lab.bench.straggler",
     "torch DDP vs potluck equal vs balanced shares, one worker held to a CPU quota"),
    ("byzantine", "potluck_lab.bench.byzantine",
     "plain mean vs potluck trust, 4 workers with 1 attacker (6 attacks)"),
    ("wan", "potluck_lab.bench.wan",
     "torch DDP (plain, fp16 hook) vs potluck DiLoCo over a rate-limited link"),
    ("loader", "potluck_lab.bench.loader",
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
    parser = build_parser(words)
    args, extras = parser.parse_known_args(words)
    if extras:
        return _unknown(parser, args, extras)
    if args.command == "bench":
        return _bench(args)
    table = dict((c, m) for c, m, _ in _COMMANDS)
    result: int = _module(table[args.command]).main(args)
    return result


def _unknown(parser: argparse.ArgumentParser, args: argparse.Namespace,
             extras: list[str]) -> int:
    """Words no flag of the command takes. A flag is named with the closest known one
    (``potluck run`` takes no abbreviations, and a typo'd flag before the script would
    make its value the script); anything else is argparse's usual error."""
    path = ["bench", args.bench] if args.command == "bench" else [args.command]
    command = parser
    for word in path:
        command = _subparsers(command).choices[word]
    flags = [word for word in extras if word.startswith("-")]
    if not flags:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    print(unknown_flag(command.prog, flags[0], visible_flags(command)), file=sys.stderr)
    return 2


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def visible_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The flags ``--help`` lists for ``parser``."""
    return [flag for action in parser._actions if action.help is not argparse.SUPPRESS
            for flag in action.option_strings if flag.startswith("--")]


def did_you_mean(word: str, known: Iterable[str]) -> str | None:
    """The known flag closest to ``word`` (``--flag`` or ``--flag=value``), spelled as the
    user spells flags (dashes or torchrun's underscores); None when none is close."""
    flag = word.split("=", 1)[0]
    dashed = sorted({_dashes(k) for k in known})
    wanted = _dashes(flag)
    starts = [k for k in dashed if k.startswith(wanted)]
    close = starts if len(starts) == 1 else difflib.get_close_matches(wanted, dashed, n=1,
                                                                        cutoff=0.6)
    if not close:
        return None
    return "--" + close[0][2:].replace("-", "_") if "_" in flag else close[0]


def unknown_flag(prog: str, word: str, known: Iterable[str]) -> str:
    """One line for a flag ``prog`` does not have: the flag, the closest known one."""
    flag = word.split("=", 1)[0]
    guess = did_you_mean(flag, known)
    hint = f": did you mean {guess}?" if guess else ""
    script = "; the script's own flags go after its path" if prog.endswith(" run") else ""
    return f"{prog}: unknown flag {flag}{hint} (see {prog} --help{script})"


def _dashes(flag: str) -> str:
    return "--" + flag.lstrip("-").replace("_", "-")


def _bench(args: argparse.Namespace) -> int:
    """Run one bench. A bad flag exits 2, as argparse's own errors do: the ``--json``
    path is checked here for every bench, before it runs (not after, when its results
    would be lost), and a bench's own checks raise ``ConfigError``."""
    from potluck.errors import ConfigError
    from potluck_lab.common import check_json_path

    module = dict((c, m) for c, m, _ in _BENCHES)[args.bench]
    try:
        check_json_path(getattr(args, "json", None))
        result: int = _module(module).main(args)
    except ConfigError as exc:
        print(f"potluck bench {args.bench}: {exc}", file=sys.stderr)
        return 2
    return result
