"""What ``potluck bench straggler`` prints and writes, from its results (pure).

``report_lines``: the header, the throughput table (each rank alone, their sum, the
contenders against it and against torch DDP), where each contender's step time goes,
and the figure lines with their goals. ``report_json``: the headline figures first,
then the medians, the config and every run's results; NaN becomes null.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from potluck_lab.bench import straggler_figures as fig
from potluck_lab.common import table

if TYPE_CHECKING:
    from potluck_lab.bench.straggler import StragglerConfig

LABELS = {"ddp": "torch DDP, equal", "potluck": "potluck, equal",
          "balanced": "potluck, balanced"}


def report_lines(config: StragglerConfig, results: dict[str, Any],
                 cpus: Sequence[int]) -> list[str]:
    """The report on screen; ``cpus``: the CPU each rank was pinned to."""
    top = fig.summarize_rounds(results["rounds"], config.contenders, config.workers)
    change, check = results["change"], results["check"]
    ideal, ddp = top["ideal_samples_per_s"], top["samples_per_s"].get("ddp", math.nan)
    lines = [f"potluck bench straggler: {config.workers} workers on CPUs "
             f"{','.join(str(cpu) for cpu in cpus)} (one torch thread each), rank "
             f"{config.slow} held to {config.quota:g} of a core (cgroup, "
             f"{config.period_us / 1000:g} ms period), gloo, {config.global_batch} "
             f"samples/step, {config.rounds} interleaved round(s) of {config.steps} timed "
             "steps"]
    rows: list[list[Any]] = [
        [f"rank {rank} alone" + (f" at {config.quota:g}" if rank == config.slow else ""),
         rate, rate / ideal, "-"] for rank, rate in enumerate(top["solo_samples_per_s"])]
    rows.append(["ideal (sum alone)", ideal, 1.0, "-"])
    rows += [[LABELS[name], rate, rate / ideal, rate / ddp]
             for name, rate in top["samples_per_s"].items()]
    lines.append(table(["contender", "samples/s", "vs ideal", "vs torch DDP"], rows))
    lines.append("where the time goes (ms per step, medians; backward: until this rank's "
                 "last gradient; wait: the rest, the all-reduce; step: with potluck's "
                 "collectives):")
    lines.append(table(["contender", "rank", "samples", "load", "forward", "backward",
                        "wait", "step", "CPU/wall"],
                       fig.time_rows(results["rounds"], config.contenders, config.workers,
                                     LABELS)))
    low, high = (f"{q:g}" for q in (config.low, config.high))
    lines += [
        f"balanced vs torch DDP: {_fmt(top['balanced_vs_ddp'])} (rounds "
        f"{_span(top['balanced_vs_ddp_rounds'])}; goal >= 1.45; ideal "
        f"{_fmt(top['ideal_vs_ddp'])}: the sum alone over {config.workers} x the slowest)",
        f"balanced, fraction of ideal: {_fmt(top['fraction_of_ideal'])} (rounds "
        f"{_span(top['fraction_of_ideal_rounds'])}; goal >= 0.95)",
        f"  synchronous steps replayed on the solos' own step-to-step speeds, no "
        f"communication (an estimate of what the machine's noise alone costs): the best "
        f"fixed split {_fmt(top['sync_ceiling'])} of the ideal (rounds "
        f"{_span(top['sync_ceiling_rounds'])}), potluck's planner "
        f"{_fmt(top['planner_replay'])} (rounds {_span(top['planner_replay_rounds'])}); "
        f"balanced reached {_fmt(top['fraction_of_ceiling'])} of the best split's samples/s",
        f"quota {high} -> {low} -> {high} mid-run, steps below {1 - fig.TOLERANCE:.0%} of "
        f"the new ideal before {fig.HOLD} in a row above it: "
        f"{_pair(change['rebalance_steps_each'])} (rebalance_steps: the larger; goal <= 5); "
        f"below 90% of the run's own later pace: {_pair(change['settle_steps_each'])}",
        f"float64, balanced (split {check['splits'][0]} -> {check['splits'][-1]}) vs one "
        f"process: max |param diff| {check['max_param_diff']:.3g} (goal < 1e-9)",
    ]
    return lines


def report_json(config: StragglerConfig, results: dict[str, Any]) -> dict[str, Any]:
    """The ``--json`` report: the four headline figures, then everything behind them."""
    top = fig.summarize_rounds(results["rounds"], config.contenders, config.workers)
    change, check = results["change"], results["check"]
    headline = {"balanced_vs_ddp": top.pop("balanced_vs_ddp"),
                "fraction_of_ideal": top.pop("fraction_of_ideal"),
                "rebalance_steps": change["rebalance_steps"],
                "max_param_diff": check["max_param_diff"]}
    return {**headline, **top, "config": asdict(config), "rounds": results["rounds"],
            "quota_change": change, "check": check, "worker_pids": results["worker_pids"]}


def _fmt(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3g}"


def _span(values: list[float]) -> str:
    finite = [v for v in values if not math.isnan(v)]
    return f"{min(finite):.3g}-{max(finite):.3g}" if finite else "-"


def _pair(values: list[int | None]) -> str:
    return " and ".join("never" if v is None else str(v) for v in values)
