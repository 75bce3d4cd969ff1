"""The lab's driver skeleton: how a bench goes from flags to figures.

Every bench is a ``Bench``: flags -> a frozen config -> its runs -> printed lines and a
JSON payload. ``drive`` runs one and owns what each bench would otherwise repeat: the
header, a logs directory (kept with ``--logs``, else removed after a success), SIGTERM
handled as Ctrl-C, the exit codes, and ``--json``. ``run_interleaved`` runs contenders
round after round in ABBA order, so drift in the machine's speed hits all alike.

Exit codes: 0 done, 1 a job failed (``PotluckError``), 2 a bad flag or a machine that
cannot run the bench (``ConfigError``, printed by ``potluck_lab.commands``), 130 stopped.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from potluck.errors import ConfigError, PotluckError
from potluck_lab.common import interleaved, sigterm_as_interrupt, write_json

C = TypeVar("C")  # a bench's config
R = TypeVar("R")  # what its runs measured
T = TypeVar("T")


@dataclass(frozen=True)
class Bench(Generic[C, R]):
    """One bench, as ``drive`` runs it.

    ``configure`` turns the flags into a validated config (``ConfigError`` names the
    flag). ``measure`` runs the jobs, its logs in the directory it is given. ``lines``
    and ``payload`` turn the results into the printed report and the ``--json`` file.
    """

    name: str
    configure: Callable[[argparse.Namespace], C]
    measure: Callable[[C, Path], R]
    lines: Callable[[C, R], Sequence[str]]
    payload: Callable[[C, R], dict[str, Any]]
    header: Callable[[C], str] | None = None  # printed before the runs start
    unavailable: Callable[[], str | None] | None = None  # why this machine cannot run it
    logs: Callable[[C], str | None] = lambda config: None  # a directory to keep (--logs)
    exit_code: Callable[[R], int] = lambda results: 0
    stopped: str = "every job was stopped"  # said after Ctrl-C or SIGTERM


def drive(bench: Bench[C, R], args: argparse.Namespace) -> int:
    """Run ``bench`` with the parsed flags ``args``; the process's exit code."""
    config = bench.configure(args)
    if bench.unavailable is not None and (problem := bench.unavailable()) is not None:
        raise ConfigError(problem)
    kept = bench.logs(config)
    logs = Path(kept) if kept else Path(tempfile.mkdtemp(prefix=f"potluck-{bench.name}-"))
    if bench.header is not None:
        print(bench.header(config), flush=True)
    prefix = f"potluck bench {bench.name}"
    try:
        with sigterm_as_interrupt():
            results = bench.measure(config, logs)
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted; {bench.stopped}", file=sys.stderr)
        _discard(logs, kept)
        return 130
    except PotluckError as exc:  # the logs stay: the message says where
        print(f"{prefix}: {exc}", file=sys.stderr)
        # a job that refused its settings is a bad configuration (2), as a flag is
        return 2 if isinstance(exc, ConfigError) else 1
    _discard(logs, kept)
    json_path = getattr(args, "json", None)
    if json_path:  # first: a report that fails must not lose the run
        write_json(json_path, bench.payload(config, results))
    print("\n".join(bench.lines(config, results)), flush=True)
    return bench.exit_code(results)


def _discard(logs: Path, kept: str | None) -> None:
    if not kept:
        shutil.rmtree(logs, ignore_errors=True)


@dataclass(frozen=True)
class Run(Generic[T]):
    """One contender's run in one round."""

    contender: str
    round: int
    result: T


def run_interleaved(contenders: Sequence[str], rounds: int,
                    run: Callable[[str, int], T]) -> list[Run[T]]:
    """``run(contender, round)`` for every contender, ``rounds`` times, in ABBA order."""
    return [Run(name, index // len(contenders), run(name, index // len(contenders)))
            for index, name in enumerate(interleaved(contenders, rounds))]


def by_contender(runs: Sequence[Run[T]]) -> dict[str, list[T]]:
    """The results of each contender, in the order they ran."""
    out: dict[str, list[T]] = {}
    for run in runs:
        out.setdefault(run.contender, []).append(run.result)
    return out


def given(config: C, **flags: object) -> C:
    """``config`` with every flag that was given (not None) in place of its value."""
    return replace(config, **{name: value for name, value in flags.items()  # type: ignore[type-var]
                              if value is not None})


def ratio(a: float, b: float) -> float:
    """``a / b``; NaN where either is NaN or ``b`` is 0 (nothing to compare)."""
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan
