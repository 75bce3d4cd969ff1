"""``potluck demo --uneven``: the demo's transformer on workers of unequal speed, balanced.

The workers are started by the launcher's agent, in this process, exactly as

    potluck run --balance --nproc-per-node 2 -m potluck_lab.demo.uneven_worker ...

would start them, so ``potluck.prepare`` gives each worker a share of every step by its
measured speed. Each worker is pinned to a core of its own where there are enough, and
worker 1 is slowed: to 0.4 of a core by a CPU quota (a cgroup v1 group this process
makes, ``machine.cpu_quota``; the worker moves its whole process in before it trains)
when root and cgroup v1 allow, else by a sleep in its every forward, which the header
says. The group is removed at the end, on a failure or Ctrl-C too. After the balanced
steps the workers train a few more on equal shares, to measure what balancing gained.
The progress shows each step's split (``shares 23/9``) and its moves; the closing
summary (``uneven_report``) the split at the start and the end, and both throughputs.
Results go to ``runs/demo-uneven/``, apart from the other demos'.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from potluck.errors import ConfigError
from potluck.launch.config import LaunchConfig
from potluck.metrics.journal import read_journal
from potluck_lab.demo.launched import LaunchedConfig, ended_badly, model_line, run_workers
from potluck_lab.demo.presets import (
    UNEVEN_FULL,
    UNEVEN_QUICK,
    check_seed,
    check_several_workers,
    refuse_resume,
    sized,
    worker_argv,
)
from potluck_lab.demo.progress import MetricsFollower, choose_display, make_progress
from potluck_lab.demo.report import loss_summary
from potluck_lab.demo.uneven_report import summarize, summary_lines
from potluck_lab.machine import cpu_quota

WORKER_MODULE = "potluck_lab.demo.uneven_worker"
SLOW_RANK = 1  # the worker slowed (launch rank); rank 0 writes the metrics
SLOW_FRACTION = 0.4  # of one core (the hidden --slow-fraction)
QUOTA_PERIOD_US = 10_000  # short periods spread the quota's pauses evenly over a step
CGROUP_PREFIX = "potluck-demo-uneven-"  # + the demo's pid: a stale group is found by its pid
# Not the plain demo's runs/demo/ nor the chaos demo's: each keeps its own results.
UNEVEN_METRICS = Path("runs/demo-uneven/metrics.jsonl")


@dataclass(frozen=True)
class UnevenConfig(LaunchedConfig):
    slow_by: str  # "auto": a CPU quota where possible, else sleeps; "cgroup"; "sleep"
    fraction: float  # of one core, for the slowed worker


@dataclass(frozen=True)
class Slowdown:
    """How worker ``SLOW_RANK`` is slowed to ``fraction`` of a core: a quota, or sleeps
    (``why_not``: why no quota)."""

    fraction: float
    quota: cpu_quota.CpuQuota | None
    why_not: str | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Hidden flags: how the worker is slowed (tests: the sleep fallback as root), and
    to what fraction of a core."""
    parser.add_argument("--slow-by", choices=("auto", "cgroup", "sleep"), default="auto",
                        help=argparse.SUPPRESS)
    parser.add_argument("--slow-fraction", type=float, default=SLOW_FRACTION,
                        help=argparse.SUPPRESS)


def config_from_args(args: argparse.Namespace) -> UnevenConfig:
    """Validate the demo's flags for an uneven run; ConfigError names value, rule, fix."""
    preset = sized(args, UNEVEN_FULL, UNEVEN_QUICK)
    steps, batch = preset.steps, preset.global_batch
    if args.chaos:
        raise ConfigError("--uneven with --chaos: they are two demos; run one, then the other")
    check_several_workers("uneven", args.workers, "one worker is slowed and the others take "
                                                  "up its slack")
    if steps < 1:
        raise ConfigError(f"--steps {steps}: need at least 1 step; use e.g. --steps "
                          f"{(UNEVEN_QUICK if args.quick else UNEVEN_FULL).steps}")
    if batch < 2 * args.workers:
        raise ConfigError(f"--uneven with global batch {batch} (--batch-size) and --workers "
                          f"{args.workers}: every worker keeps at least one sample a step, so "
                          "the split can only move with at least 2 per worker; use e.g. "
                          f"--batch-size {16 * args.workers}")
    check_seed(args.seed)
    if not 0.01 <= args.slow_fraction < 1.0:
        raise ConfigError(f"--slow-fraction {args.slow_fraction}: the slowed worker's part of "
                          f"a core, from 0.01 to below 1; use e.g. --slow-fraction "
                          f"{SLOW_FRACTION}")
    refuse_resume(args.resume, "uneven", "")
    return UnevenConfig(
        workers=args.workers, seed=args.seed,
        preset=replace(preset, equal_steps=min(preset.equal_steps, steps)),
        slow_by=args.slow_by, fraction=args.slow_fraction,
        metrics=UNEVEN_METRICS if args.metrics is None else args.metrics,
        progress=not args.no_progress,
    )


def choose_cores(workers: int, available: set[int]) -> list[int]:
    """A core per worker, in order, if there are enough; else none (no pinning)."""
    cores = sorted(available)
    return cores[:workers] if len(cores) >= workers else []


def usable_cores() -> set[int]:
    """The cores this process may run on (none known where the OS will not say)."""
    affinity = getattr(os, "sched_getaffinity", None)  # Linux
    return set(affinity(0)) if affinity is not None else set()


def set_up_slowdown(slow_by: str, fraction: float) -> Slowdown:
    """A CPU-quota cgroup if asked and possible; raises ConfigError for ``cgroup`` when
    it is not."""
    if slow_by == "sleep":
        return Slowdown(fraction, None, "--slow-by sleep was given")
    why_not = cpu_quota.unavailable()
    if why_not is None:
        try:
            cpu_quota.remove_stale(CGROUP_PREFIX)
            quota = cpu_quota.CpuQuota(f"{CGROUP_PREFIX}{os.getpid()}",
                                       period_us=QUOTA_PERIOD_US).create(fraction)
            return Slowdown(fraction, quota)
        except cpu_quota.CgroupError as exc:
            why_not = str(exc)
    if slow_by == "cgroup":
        raise ConfigError(f"--slow-by cgroup: {why_not}; run as root on a system with "
                          "cgroup v1, or drop --slow-by")
    return Slowdown(fraction, None, why_not)


def launch_config(config: UnevenConfig, slowdown: Slowdown, cores: list[int]) -> LaunchConfig:
    """What ``potluck run --balance --nproc-per-node W -m <worker> ...`` would build."""
    worker_args = [
        "--metrics", str(config.metrics), *worker_argv(config.preset, config.seed),
        "--equal-steps", str(config.preset.equal_steps),
        "--cores", ",".join(str(core) for core in cores), "--slow-rank", str(SLOW_RANK),
    ]
    if slowdown.quota is not None:
        worker_args += ["--cgroup", str(slowdown.quota.path)]
    else:
        worker_args += ["--sleep-fraction", f"{slowdown.fraction:g}"]
    return LaunchConfig(script=WORKER_MODULE, script_args=tuple(worker_args), module=True,
                        nproc_per_node=config.workers, balance=True,
                        run_id=f"demo-uneven-{secrets.token_hex(4)}", grace_period=3.0)


def main(args: argparse.Namespace) -> int:
    """Run the uneven demo: 0 on success, 1 on failure, 130 on Ctrl-C; a bad flag
    raises ``ConfigError`` (``cli.main`` exits 2)."""
    config = config_from_args(args)
    slowdown = set_up_slowdown(config.slow_by, config.fraction)
    started = time.perf_counter()
    try:
        code, emitted = _train(config, slowdown)
    except KeyboardInterrupt:  # before the workers started
        code, emitted = 130, []
    finally:
        throttled = _remove(slowdown)
    run_dir = config.metrics.parent
    records = [] if code >= 128 else [r for r in read_journal(config.metrics)
                                      if r.get("kind") == "step"]
    failed = ended_badly(code, emitted, len(records),
                         config.preset.steps + config.preset.equal_steps, "uneven",
                         run_dir / "workers.log")
    if failed is not None:
        return failed
    _print_report(config, records, throttled)
    print(f"done in {time.perf_counter() - started:.1f} s; per-step metrics (with each "
          f"step's shares) in {config.metrics}; worker output in {run_dir / 'workers.log'}")
    return 0


def _train(config: UnevenConfig, slowdown: Slowdown) -> tuple[int, list[str]]:
    """Launch the workers and show their progress; the agent's exit code and output."""
    run_dir = config.metrics.parent
    run_dir.mkdir(parents=True, exist_ok=True)
    config.metrics.unlink(missing_ok=True)  # the display must not show an old run
    cores = choose_cores(config.workers, usable_cores())
    launch = launch_config(config, slowdown, cores)
    _print_header(config, launch, slowdown, cores)
    display = choose_display(config.progress, sys.stdout, sys.stderr)
    total = config.preset.steps + config.preset.equal_steps
    progress = MetricsFollower(config.metrics, make_progress(
        display, total, f"{config.workers} workers", sys.stdout, shares=True))
    return run_workers(launch, run_dir / "workers.log", progress)


def _remove(slowdown: Slowdown) -> cpu_quota.Throttling | None:
    """Delete the quota's group (what it held back first); a failure is only reported."""
    quota = slowdown.quota
    if quota is None:
        return None
    throttled = quota.throttling()
    try:
        quota.remove()
    except cpu_quota.CgroupError as exc:
        print(f"potluck demo: warning: {exc}", file=sys.stderr)
    return throttled


def _print_header(config: UnevenConfig, launch: LaunchConfig, slowdown: Slowdown,
                  cores: list[int]) -> None:
    p = config.preset
    print(model_line("potluck demo --uneven", p, config.seed))
    print(f"{config.workers} workers x 1 thread on Gloo, global batch {p.global_batch} "
          f"shared by measured speed, {p.steps} steps, then {p.equal_steps} on equal shares "
          f"to compare, seed {config.seed}, started as:")
    print(f"  potluck run --balance --nproc-per-node {launch.nproc_per_node} -m "
          f"{launch.script} {' '.join(launch.script_args)}")
    if cores:
        print("cores: " + ", ".join(f"worker {rank} on core {core}"
                                    for rank, core in enumerate(cores)))
    else:
        print(f"cores: not pinned ({config.workers} workers, {len(usable_cores()) or '?'} "
              "cores to pin them to)")
    for line in slowdown_lines(slowdown):
        print(line)
    print(f"results: per-step metrics (with each step's shares) to {config.metrics}, "
          f"worker output to {config.metrics.parent / 'workers.log'}", flush=True)


def slowdown_lines(slowdown: Slowdown) -> list[str]:
    """What the header says about the slowed worker (pure)."""
    quota = slowdown.quota
    if quota is not None:
        return [f"slowed: worker {SLOW_RANK} gets {quota.fraction:g} of a core: a CPU quota "
                f"of {quota.quota_us} us per {quota.period_us} us (cgroup v1 group "
                f"{quota.path}), its whole process moved in before it trains"]
    return [f"slowed: worker {SLOW_RANK} could not get a CPU quota: {slowdown.why_not}",
            f"slowed: instead worker {SLOW_RANK} sleeps in every forward pass for as long as "
            f"running at {slowdown.fraction:g} of a core would add (its own full speed timed "
            "first): an emulation; its core idles meanwhile"]


def _print_report(config: UnevenConfig, records: list[dict[str, object]],
                  throttled: cpu_quota.Throttling | None) -> None:
    p = config.preset
    print()
    if throttled is not None:
        print(f"worker {SLOW_RANK}'s CPU quota held it back in {throttled.throttled:,} of "
              f"{throttled.periods:,} scheduler periods ({throttled.throttled_s:.1f} s in all)")
    for line in summary_lines(summarize(records, p.global_batch, p.warmup_steps),
                              p.global_batch):
        print(line)
    losses = [float(r["loss"]) for r in records]  # type: ignore[arg-type]
    print(loss_summary(losses))
    print()
