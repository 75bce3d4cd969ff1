"""Seeing a run: the standard DDP figures, the JSON-lines journal of records, sync timing."""

from potluck.metrics.figures import (
    LatencySummary,
    ScalingFigures,
    scaling_efficiency,
    scaling_figures,
    speedup,
    steady_state,
    summarize_latency,
    throughput,
)
from potluck.metrics.journal import Journal, JournalFollower, read_journal
from potluck.metrics.latency import RoundTrips, measure_round_trips
from potluck.metrics.sync_timer import SyncTimer

__all__ = [
    "Journal",
    "JournalFollower",
    "LatencySummary",
    "RoundTrips",
    "ScalingFigures",
    "SyncTimer",
    "measure_round_trips",
    "read_journal",
    "scaling_efficiency",
    "scaling_figures",
    "speedup",
    "steady_state",
    "summarize_latency",
    "throughput",
]
