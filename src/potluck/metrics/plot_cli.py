"""``potluck plot RUN_DIR [--out DIR]``: PNG plots of a run from its JSON-lines journals.

Reads RUN_DIR/*.jsonl and RUN_DIR/ranks/*.jsonl (potluck.metrics.journal records) and
writes loss.png, throughput.png, compute_wait.png, shares.png and events.png to
RUN_DIR/plots (or --out); a plot whose data the run did not record is skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from potluck.errors import ConfigError
from potluck.metrics.plots import load_run, skipped_plots, write_plots


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
        print(f"potluck plot: error: {exc}", file=sys.stderr)
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
