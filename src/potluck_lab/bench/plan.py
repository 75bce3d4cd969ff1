"""``potluck bench plan``: the planner's predictions against measured runs.

    potluck bench plan [--quick] [--no-selection] [--logs DIR] [--json PATH]

Workers are hosts on one switch (``machine/netns.py``: ``BridgedHosts``), each link
capped both ways by ``tc tbf``, each worker under a CPU quota of its own (with a high
CPU weight, so the machine's other work waits). The job is ``plan_job.py``'s MLP,
every step (balanced shares) or DiLoCo. In order:

1. calibration: one worker alone at each batch size a worker takes, then two
   workers on uncapped links, every step and DiLoCo (the reducer's and a round's
   overheads: what the model did not account for);
2. validation: 2, 3 and 4 workers at three link rates, every step and DiLoCo, and with
   one worker at half the quota at the middle rate: each run's steady samples/s
   against the model's prediction, from the calibration alone;
3. selection: 8 candidates of mixed quotas and links; the planner's cohort (every
   step), all 8, and as many of the fastest by compute as it chose, each measured.

The figures are in ``plan_figures.py``; the JSON's top level has median_abs_error,
max_abs_error, selection_vs_all and selection_vs_fastest.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from potluck.plan import Overheads, Search, Workload, choose, diloco, every_step, predict
from potluck_lab.bench.plan_figures import (
    Compute,
    error,
    machine,
    steady_rate,
    summary,
)
from potluck_lab.bench.plan_job import mlp_parameters
from potluck_lab.bench.plan_runs import Runs, Spec
from potluck_lab.bench.wan import rate_bits
from potluck_lab.common import BenchError, table
from potluck_lab.driver import Bench, drive
from potluck_lab.machine.netns import BridgedHosts, NetnsError, unavailable

# The selection's candidates: (quota of a core, link rate). The fastest by compute has
# the slowest link; one mid-speed machine has a slow one too.
CANDIDATES = ((0.30, "10mbit"), (0.25, "320mbit"), (0.25, "320mbit"), (0.20, "320mbit"),
              (0.20, "24mbit"), (0.15, "320mbit"), (0.15, "320mbit"), (0.10, "320mbit"))


@dataclass(frozen=True)
class PlanBenchConfig:
    sizes: tuple[int, ...] = (2, 3, 4)
    rates: tuple[str, ...] = ("20mbit", "80mbit", "320mbit")
    slow_rate: str = "80mbit"
    quota: float = 0.4
    slow_quota: float = 0.2
    global_batch: int = 1024
    inner_steps: int = 8
    steps: int = 14
    skip_steps: int = 5
    rounds: int = 5
    skip_rounds: int = 1
    selection: bool = True
    logs: str | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="2 and 3 workers at two rates, shorter runs")
    parser.add_argument("--no-selection", action="store_true",
                        help="leave out the selection of 8 candidates")
    parser.add_argument("--logs", metavar="DIR", help="keep the workers' output here")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")


def configure(args: argparse.Namespace) -> PlanBenchConfig:
    config = PlanBenchConfig(selection=not args.no_selection, logs=args.logs)
    if args.quick:
        config = replace(config, sizes=(2, 3), rates=("20mbit", "320mbit"), steps=11,
                         rounds=4)
    for rate in (*config.rates, config.slow_rate, *(r for _, r in CANDIDATES)):
        rate_bits(rate)
    return config


@dataclass(frozen=True)
class Calibration:
    line: Compute
    overheads: Overheads


def calibrate(config: PlanBenchConfig, runs: Runs) -> Calibration:
    g, q = config.global_batch, config.quota
    batches = sorted({g // n for n in config.sizes}
                     | ({g // len(CANDIDATES)} if config.selection else set()))
    seconds = {}
    for batch in batches:
        commits = runs.run(Spec("step", [q], [None], config.steps, batch, 1))
        seconds[batch] = batch / steady_rate(commits, config.skip_steps)
    line = Compute(seconds, q)
    workload = Workload(mlp_parameters(), g)
    pair = [machine(f"w{i}", line.speed(g / 2, q), None) for i in range(2)]
    over = {}
    for mode, model, skip, periods in (("step", every_step(), config.skip_steps, config.steps),
                                       ("diloco", diloco(config.inner_steps),
                                        config.skip_rounds, config.rounds)):
        commits = runs.run(Spec(mode, [q, q], [None, None], periods, g, config.inner_steps))
        measured = model.inner_steps * g / steady_rate(commits, skip)
        over[mode] = max(0.0, measured - predict(pair, workload, model).period_s)
    return Calibration(line, Overheads(step_s=over["step"], round_s=over["diloco"]))


def validation_specs(config: PlanBenchConfig) -> list[tuple[str, Spec]]:
    specs = []
    for n in config.sizes:
        for rate in config.rates:
            for mode in ("step", "diloco"):
                specs.append((f"{n} workers, {rate}, {mode}", _spec(config, mode, n, rate,
                                                                   [config.quota] * n)))
        for mode in ("step", "diloco"):
            quotas = [config.quota] * (n - 1) + [config.slow_quota]
            specs.append((f"{n} workers, {config.slow_rate}, {mode}, one at "
                          f"{config.slow_quota:g} core", _spec(config, mode, n,
                                                               config.slow_rate, quotas)))
    return specs


def _spec(config: PlanBenchConfig, mode: str, n: int, rate: str | None,
          quotas: list[float]) -> Spec:
    periods = config.steps if mode == "step" else config.rounds
    return Spec(mode, quotas, [rate] * n, periods, config.global_batch, config.inner_steps)


def predicted(spec: Spec, config: PlanBenchConfig, cal: Calibration) -> float:
    n = len(spec.quotas)
    members = [machine(f"w{i}", cal.line.speed(spec.global_batch / n, q),
                       None if r is None else rate_bits(r))
               for i, (q, r) in enumerate(zip(spec.quotas, spec.rates, strict=True))]
    mode = every_step() if spec.mode == "step" else diloco(spec.inner_steps)
    workload = Workload(mlp_parameters(), spec.global_batch, overheads=cal.overheads)
    return predict(members, workload, mode).samples_per_s


def measured(spec: Spec, config: PlanBenchConfig, runs: Runs) -> float:
    skip = config.skip_steps if spec.mode == "step" else config.skip_rounds
    return steady_rate(runs.run(spec), skip)


def selection(config: PlanBenchConfig, cal: Calibration, runs: Runs) -> dict[str, Any]:
    g = config.global_batch
    machines = [machine(f"c{i}", cal.line.speed(g / len(CANDIDATES), q), rate_bits(r))
                for i, (q, r) in enumerate(CANDIDATES)]
    workload = Workload(mlp_parameters(), g, overheads=cal.overheads)
    choice = choose(machines, every_step(), Search(workload))
    assert choice is not None  # no target: some cohort is always taken
    chosen = [int(m.name[1:]) for m in choice.members]
    by_compute = sorted(range(len(CANDIDATES)), key=lambda i: -CANDIDATES[i][0])
    cohorts = {"chosen": chosen, "all": list(range(len(CANDIDATES))),
               "fastest": sorted(by_compute[:len(chosen)])}
    out: dict[str, Any] = {"candidates": [list(c) for c in CANDIDATES]}
    for name, members in cohorts.items():
        spec = Spec("step", [CANDIDATES[i][0] for i in members],
                    [CANDIDATES[i][1] for i in members], config.steps, g, config.inner_steps)
        cohort = [machines[i] for i in members]
        out[name] = {"members": members, "measured": measured(spec, config, runs),
                     "predicted": predict(cohort, workload, every_step()).samples_per_s}
    out["selection_vs_all"] = out["chosen"]["measured"] / out["all"]["measured"]
    out["selection_vs_fastest"] = out["chosen"]["measured"] / out["fastest"]["measured"]
    return out


def measure(config: PlanBenchConfig, logs: Path) -> dict[str, Any]:
    hosts_needed = len(CANDIDATES) if config.selection else max(config.sizes)
    try:
        with BridgedHosts(hosts_needed, prefix="pl-plan") as hosts, \
                Runs(hosts, logs, f"potluck-plan-{os.getpid()}") as runs:
            cal = calibrate(config, runs)
            print(f"calibrated: {cal.line}, {cal.overheads}", file=sys.stderr, flush=True)
            rows: list[dict[str, Any]] = []
            for label, spec in validation_specs(config):
                got = measured(spec, config, runs)
                want = predicted(spec, config, cal)
                rows.append({"run": label, "predicted": want, "measured": got,
                             "error": error(want, got)})
                print(f"{label}: predicted {want:.1f}, measured {got:.1f} samples/s",
                      file=sys.stderr, flush=True)
            chosen = selection(config, cal, runs) if config.selection else None
    except NetnsError as exc:
        raise BenchError(str(exc).splitlines()[0]) from None
    figures = summary([r["error"] for r in rows])
    return {**figures,
            "selection_vs_all": None if chosen is None else chosen["selection_vs_all"],
            "selection_vs_fastest": None if chosen is None else chosen["selection_vs_fastest"],
            "rows": rows, "selection": chosen,
            "calibration": {"local_step_s": cal.line.seconds,
                            "quota": cal.line.quota_ref, "step_s": cal.overheads.step_s,
                            "round_s": cal.overheads.round_s}}


def lines(config: PlanBenchConfig, results: dict[str, Any]) -> list[str]:
    rows = [[r["run"], f"{r['predicted']:.1f}", f"{r['measured']:.1f}", f"{r['error']:+.1%}"]
            for r in results["rows"]]
    out = [table(["run", "predicted samples/s", "measured", "error"], rows)]
    out.append(f"median_abs_error: {results['median_abs_error']:.3f}; max_abs_error: "
               f"{results['max_abs_error']:.3f}")
    chosen = results["selection"]
    if chosen:
        for name in ("chosen", "all", "fastest"):
            c = chosen[name]
            out.append(f"selection {name}: candidates {c['members']}, measured "
                       f"{c['measured']:.1f} samples/s (predicted {c['predicted']:.1f})")
        out.append(f"selection_vs_all: {chosen['selection_vs_all']:.3f}; "
                   f"selection_vs_fastest: {chosen['selection_vs_fastest']:.3f}")
    return out


def _unavailable() -> str | None:
    from potluck_lab.machine.cpu_quota import unavailable as no_quota

    return unavailable() or no_quota()


def main(args: argparse.Namespace) -> int:
    return drive(BENCH, args)


BENCH = Bench("plan", configure, measure, lines,
              lambda config, results: {**results, "config": vars(config)},
              header=lambda c: (f"potluck bench plan: {c.sizes} workers at {c.rates}, "
                                f"quota {c.quota:g} core each, global batch "
                                f"{c.global_batch}, DiLoCo H={c.inner_steps}"),
              unavailable=_unavailable, logs=lambda config: config.logs)
