"""The status snapshot as Prometheus text (exposition format 0.0.4), for ``/metrics``.

``render_prometheus`` is a pure function of the ``/api/status`` mapping (docs/status.md):
every metric is a gauge; per-rank metrics carry the labels ``rank`` and ``worker`` (the
process, ``host:pid``: a rank is a seat that another worker takes after a membership
change or a restart). A value that is
missing or null is left out rather than written as NaN; ``potluck_slowest_rank`` is -1
when no rank stands out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

# (metric, help, key in the snapshot)
_COHORT: tuple[tuple[str, str, str], ...] = (
    ("potluck_step", "Index of the cohort's latest committed global step.", "step"),
    ("potluck_world_size", "Number of ranks in the current generation.", "world_size"),
    ("potluck_generation", "Membership generation of the cohort.", "generation"),
    ("potluck_efficiency", "Cohort throughput against the ideal (0..1).", "efficiency"),
)

# (metric, help, key in a rank's entry, factor to the metric's unit)
_PER_RANK: tuple[tuple[str, str, str, float], ...] = (
    ("potluck_rank_compute_seconds", "Local compute time of the rank's last step.",
     "compute_ms", 1e-3),
    ("potluck_rank_wait_seconds", "Time the rank blocked in collectives in its last step.",
     "wait_ms", 1e-3),
    ("potluck_rank_comm_seconds", "Wall time the rank's collectives were in flight.",
     "comm_ms", 1e-3),
    ("potluck_rank_step_seconds", "Wall time of the rank's last step.", "step_ms", 1e-3),
    ("potluck_rank_bytes", "Bytes the rank handed to its last step's collectives.",
     "bytes", 1.0),
    ("potluck_rank_share", "The rank's share of the global batch.", "share", 1.0),
    ("potluck_rank_samples_per_second", "The rank's own training speed.",
     "samples_per_s", 1.0),
    ("potluck_rank_stale", "1 when the rank has sent nothing for a few seconds.",
     "stale", 1.0),
)


def render_prometheus(status: Mapping[str, Any]) -> str:
    """The Prometheus text exposition of a ``/api/status`` snapshot."""
    lines: list[str] = []
    for name, help_text, key in _COHORT:
        _gauge(lines, name, help_text, [("", status.get(key))])
    slowest = status.get("slowest")
    slowest_rank = slowest.get("rank") if isinstance(slowest, Mapping) else None
    _gauge(lines, "potluck_slowest_rank", "Rank named slowest, -1 when none stands out.",
           [("", -1 if slowest_rank is None else slowest_rank)])
    ranks = [r for r in status.get("ranks") or () if isinstance(r, Mapping)]
    for name, help_text, key, factor in _PER_RANK:
        samples = [(f'{{rank="{_label(r.get("rank"))}",worker="{_label(r.get("worker"))}"}}',
                    _scaled(r.get(key), factor)) for r in ranks]
        _gauge(lines, name, help_text, samples)
    return "\n".join(lines) + "\n"


def _gauge(lines: list[str], name: str, help_text: str,
           samples: Iterable[tuple[str, Any]]) -> None:
    """Append one gauge family: HELP and TYPE, then one line per present sample."""
    present = [(labels, _number(value)) for labels, value in samples]
    present = [(labels, text) for labels, text in present if text is not None]
    if not present:
        return
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} gauge")
    lines.extend(f"{name}{labels} {text}" for labels, text in present)


def _scaled(value: Any, factor: float) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or factor == 1.0:
        return value
    return value * factor


def _number(value: Any) -> str | None:
    """A sample value as Prometheus writes it, or None when there is none to write."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        return repr(value)
    return None


def _label(value: Any) -> str:
    """A label value with the escapes the text format requires."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
