"""The lab's commands, ``potluck demo`` and ``potluck bench ...``, as ``potluck.cli``
finds them: ``pyproject.toml`` registers ``DEMO`` and ``BENCH`` under the
``potluck.commands`` entry point group. Nothing here imports torch: ``potluck --help``
reads these tables.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from potluck.cli import Command

DEMO = Command("demo", "potluck_lab.demo.cli",
               "train a tiny transformer on 2 local workers (the main job)", order=20)

BENCH = Command("bench", "potluck_lab.commands", "side-by-side benchmarks", order=40,
                subcommands=(
    Command("ddp", "potluck_lab.bench.ddp", "potluck.DataParallel vs torch DDP, step time"),
    Command("allreduce", "potluck_lab.bench.allreduce",
            "bucketed vs raw all-reduce bus bandwidth"),
    Command("chaos", "potluck_lab.bench.chaos",
            "random kill / freeze / leave / join trials, checked"),
    Command("faults", "potluck_lab.bench.faults",
            "potluck elastic vs torchrun restart-from-checkpoint, a worker killed every T s"),
    Command("straggler", "potluck_lab.bench.straggler",
            "torch DDP vs potluck equal vs balanced shares, one worker held to a CPU quota"),
    Command("byzantine", "potluck_lab.bench.byzantine",
            "plain mean vs potluck trust, 4 workers with 1 attacker (6 attacks)"),
    Command("wan", "potluck_lab.bench.wan",
            "torch DDP (plain, fp16 hook) vs potluck DiLoCo over a rate-limited link"),
    Command("loader", "potluck_lab.bench.loader",
            "the loader's worker processes vs reading in the loop vs torch's DataLoader"),
    Command("plan", "potluck_lab.bench.plan",
            "potluck plan's predictions vs measured runs on capped links, and its selection"),
    Command("cohort", "potluck_lab.bench.cohort",
            "the potluck cohort: uneven, unreliable, far apart, one attacker, node 0 lost"),
))


def main(args: argparse.Namespace) -> int:
    """Run one bench. A bad flag exits 2, as argparse's own errors do: the ``--json``
    path is checked here for every bench, before it runs (not after, when its results
    would be lost), and a bench's own checks raise ``ConfigError`` (``driver.drive``:
    a bad flag, or a machine that cannot run the bench)."""
    from potluck.errors import ConfigError
    from potluck_lab.common import check_json_path

    module = {c.name: c.module for c in BENCH.subcommands}[args.bench]
    try:
        check_json_path(getattr(args, "json", None))
        result: int = importlib.import_module(module).main(args)
    except ConfigError as exc:
        print(f"potluck bench {args.bench}: {exc}", file=sys.stderr)
        return 2
    return result
