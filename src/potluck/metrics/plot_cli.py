"""``potluck plot RUN_DIR [--out DIR]``: PNG plots of a run from its JSON-lines journals.

Reads RUN_DIR/*.jsonl and RUN_DIR/ranks/*.jsonl (potluck.metrics.journal records) and
writes loss.png, throughput.png, compute_wait.png, shares.png and events.png to
RUN_DIR/plots (or --out); a plot whose data the run did not record is skipped. A
RUN_DIR without records is named with what it holds and what writes records: workers
whose script calls ``potluck.prepare`` or wraps its model in ``potluck.DataParallel``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from potluck.errors import ConfigError
from potluck.metrics.journal import read_journal
from potluck.metrics.plots import PATTERNS, journal_files, load_run, skipped_plots, write_plots


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (__doc__ or "").replace("``", "")  # reST markup, not help text
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                        help="the run's metrics directory (e.g. runs/demo)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where the PNGs go (RUN_DIR/plots)")


def main(args: argparse.Namespace) -> int:
    """Write the plots; 0 on success, 2 when RUN_DIR is missing or holds no records, 1
    when the plots cannot be written."""
    run_dir: Path = args.run_dir
    out: Path = run_dir / "plots" if args.out is None else args.out
    try:
        series = load_run(run_dir)
    except ConfigError as exc:
        empty = run_dir.is_dir() and holds_no_records(run_dir)
        print(f"potluck plot: error: {no_records(run_dir) if empty else exc}", file=sys.stderr)
        return 2
    try:
        written = write_plots(series, out)
    except OSError as exc:
        print(f"potluck plot: error: cannot write the plots to {out} ({exc}); choose "
              "another directory with --out DIR", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB)")
    for name, why in skipped_plots(series):
        print(f"skipped {out / name}: {why}")
    return 0


def holds_no_records(run_dir: Path) -> bool:
    """Whether no journal in ``run_dir`` holds a record (a bad one counts as one)."""
    try:
        return not any(read_journal(path) for path in journal_files(run_dir))
    except ValueError:
        return False


def no_records(run_dir: Path, shown: int = 6) -> str:
    """What a run directory without records holds, and what writes records there."""
    entries = sorted(itertools.islice(run_dir.rglob("*"), 10 * shown))  # (a big tree: a few)
    names = [f"{e.relative_to(run_dir)}{'/' if e.is_dir() else ''}"
             f"{' (empty)' if e.is_file() and e.stat().st_size == 0 else ''}"
             for e in entries[:shown]]
    more = " and more" if len(entries) > shown else ""
    holds = f"holds {', '.join(names)}{more}" if names else "is empty"
    looked = ", ".join(str(run_dir / pattern) for pattern in PATTERNS)
    return (f"no journal records in {looked}: {run_dir} {holds}. Records come from "
            "workers whose script calls potluck.prepare(...) or wraps its model in "
            f"potluck.DataParallel: `potluck run --metrics-dir {run_dir}` (or "
            f"prepare(metrics_dir=...)) has each of them write "
            f"{run_dir / 'ranks'}/rank-<pid>.jsonl; a script on torch DDP writes none")
