"""The ``potluck`` command: argparse subcommands only (parse -> config -> call).

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``main(args) -> int``; this file only wires them together. The library's commands are
``run``, ``plot`` and ``plan``. Others register through the ``potluck.commands`` entry point
group, each entry a ``Command``: the lab (``potluck_lab``) adds ``demo`` and ``bench``
that way, so the library never imports the lab.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType

from potluck import __version__

ENTRY_POINTS = "potluck.commands"
# Registered by potluck_lab, in the same distribution: named here only to say, in one
# line, that an install without the lab lacks them.
LAB_COMMANDS = ("demo", "bench")


@dataclass(frozen=True)
class Command:
    """A ``potluck`` subcommand: ``module`` has ``add_arguments(parser)`` and
    ``main(args) -> int``. With ``subcommands`` (``potluck bench ddp``), each
    subcommand's module adds its flags and ``module``'s ``main`` runs the chosen one
    (``args.<name>`` names it). ``order`` places it in ``potluck --help``."""

    name: str
    module: str
    help: str
    order: int = 50
    subcommands: tuple[Command, ...] = ()


_LIBRARY = (
    Command("run", "potluck.launch.cli",
            "launch a training script on N workers (torchrun-compatible)", order=10),
    Command("plot", "potluck.metrics.plot_cli",
            "write PNG plots of a run (loss, throughput, compute vs wait, shares, events)",
            order=30),
    Command("plan", "potluck.plan.cli",
            "predict a cohort's throughput per sync mode and choose its machines",
            order=35),
)


def commands() -> list[Command]:
    """The library's commands and those registered under ``potluck.commands``, in
    ``potluck --help``'s order. An entry that fails to load is left out."""
    found = list(_LIBRARY)
    for entry in entry_points(group=ENTRY_POINTS):
        try:
            command = entry.load()
        except Exception:  # a stale or broken install: its command is missing
            continue
        if isinstance(command, Command) and command.name not in {c.name for c in found}:
            found.append(command)
    return sorted(found, key=lambda c: c.order)


def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


def build_parser(argv: Sequence[str] = (),
                 known: Sequence[Command] | None = None) -> argparse.ArgumentParser:
    """Every command is listed; only the one named in ``argv`` imports its module for
    its flags, so ``potluck --help`` and ``potluck run`` do not wait for torch."""
    named = [word for word in argv if not word.startswith("-")][:2]
    parser = argparse.ArgumentParser(
        prog="potluck",
        description="Distributed data-parallel training for PyTorch on uneven GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"potluck {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in commands() if known is None else known:
        if command.subcommands:
            group = sub.add_parser(command.name, help=command.help)
            group_sub = group.add_subparsers(dest=command.name, required=True)
            for leaf in command.subcommands:
                leaf_parser = group_sub.add_parser(leaf.name, help=leaf.help,
                                                   description=leaf.help)
                if named == [command.name, leaf.name]:
                    _module(leaf.module).add_arguments(leaf_parser)
            continue
        # No abbreviations: `potluck run script.py --metrics m` must hand --metrics to the
        # script, not take it for an abbreviation of run's --metrics-dir.
        command_parser = sub.add_parser(command.name, help=command.help,
                                        description=command.help, allow_abbrev=False)
        if named[:1] == [command.name]:
            _module(command.module).add_arguments(command_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    known = commands()
    named = {c.name: c for c in known}
    first = next((word for word in words if not word.startswith("-")), None)
    if first in LAB_COMMANDS and first not in named:
        print(f"potluck {first}: this command comes with potluck's lab (the potluck_lab "
              "package and its entry points), which this install lacks; reinstall potluck "
              "from its repository (pip install -e .)", file=sys.stderr)
        return 2
    parser = build_parser(words, known)
    args, extras = parser.parse_known_args(words)
    if extras:
        return _unknown(parser, args, named[args.command], extras)
    result: int = _module(named[args.command].module).main(args)
    return result


def _unknown(parser: argparse.ArgumentParser, args: argparse.Namespace, command: Command,
             extras: list[str]) -> int:
    """Words no flag of the command takes. A flag is named with the closest known one
    (``potluck run`` takes no abbreviations, and a typo'd flag before the script would
    make its value the script); anything else is argparse's usual error."""
    path = [command.name] + ([getattr(args, command.name)] if command.subcommands else [])
    chosen = parser
    for word in path:
        chosen = _subparsers(chosen).choices[word]
    flags = [word for word in extras if word.startswith("-")]
    if not flags:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    print(unknown_flag(chosen.prog, flags[0], visible_flags(chosen)), file=sys.stderr)
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
    if not flag.startswith("--") or len(flag.lstrip("-")) < 3:
        return None  # (a short option such as -n: too short to be near a long flag)
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
