"""Shared pieces of the benchmarks: summaries, interleaving order, output, errors."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from potluck.errors import ConfigError, PotluckError


class BenchError(PotluckError):
    """A bench's job failed or did not finish; the message says which, and where its
    logs are."""


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def interleaved(contenders: Sequence[str], rounds: int) -> list[str]:
    """Contender order for ``rounds`` rounds, alternating who goes first (ABBA...)."""
    order: list[str] = []
    for r in range(rounds):
        order += list(contenders) if r % 2 == 0 else list(reversed(contenders))
    return order


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def at_least(flag: str, value: float, minimum: float, example: str) -> None:
    """Refuse a count (or size) below ``minimum``: a bench of 0 rounds measures nothing."""
    if value < minimum:
        raise ConfigError(f"{flag} {value:g} must be at least {minimum:g}; use e.g. "
                          f"{flag} {example}")


def check_json_path(path: str | None) -> None:
    """Refuse a ``--json`` file that could not be written, before the bench runs rather
    than after it: its directory must exist (or be creatable) and be writable."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"--json {path} is a directory: name a file in it, e.g. --json "
                          f"{target / 'bench.json'}")
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--json {path}: cannot create its directory {parent} "
                          f"({exc.strerror or exc}); name a file in a directory this user "
                          "can write, e.g. --json results.json") from exc
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--json {path}: its directory {parent} is not writable by this "
                          "user; name a file in one that is, e.g. --json results.json")


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """``payload`` as JSON, a NaN (a figure with nothing to measure) as null."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(finite(payload), indent=2) + "\n")


def finite(value: Any) -> Any:
    """NaN becomes None, recursively, and keys become strings: valid JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within: SIGTERM raises ``KeyboardInterrupt``, so a bench stopped by a signal
    stops and reaps its jobs as on Ctrl-C."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)
