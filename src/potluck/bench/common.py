"""Shared pieces of the benchmarks: summaries, interleaving order, output."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any


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


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(payload, indent=2) + "\n")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)
