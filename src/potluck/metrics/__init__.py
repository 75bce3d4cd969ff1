"""Seeing a run: the standard DDP figures, per-step JSONL records, sync timing."""

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
from potluck.metrics.jsonl import JsonlWriter, read_jsonl
from potluck.metrics.latency import RoundTrips, measure_round_trips
from potluck.metrics.sync_timer import SyncTimer

__all__ = [
    "JsonlWriter",
    "LatencySummary",
    "RoundTrips",
    "ScalingFigures",
    "SyncTimer",
    "measure_round_trips",
    "read_jsonl",
    "scaling_efficiency",
    "scaling_figures",
    "speedup",
    "steady_state",
    "summarize_latency",
    "throughput",
]
