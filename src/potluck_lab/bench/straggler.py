"""``potluck bench straggler``: N workers, one of them held to a CPU quota (a straggler).

One long-lived worker process per rank (``straggler_job``), rank i pinned to CPU i, one
torch thread each; the last rank lives in a cgroup of its own (``machine.cpu_quota``,
10 ms period) from before it imports torch, the others in one without a quota (both
with a high CPU weight, so other work on the machine disturbs them less). The bench
sets the quota and tells the workers what to run, run after run, interleaved (ABBA):

- ``solo``: every worker alone, side by side (a one-process cohort each, ``G / N``
  samples a step, the slow one at the quota). The ideal is the sum of their samples/s.
- ``ddp``: torch DDP, equal shares; ``potluck``: ``prepare(balance=False)``, equal
  shares; ``balanced``: ``prepare(balance=True)``. The same model, data and global batch.

Then a balanced run whose slow worker goes from quota 1.0 to 0.3 and back to 1.0 at set
steps (the bench follows rank 0's step records), between solo runs at those quotas for
its ideals; and a short float64 balanced run at the quota, checked against one process.
The figures are medians over the rounds of each round's own ratios (``straggler_figures``),
printed and written by ``straggler_report``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from potluck import env as potluck_env
from potluck.errors import ConfigError
from potluck_lab.bench import straggler_figures as fig
from potluck_lab.bench.straggler_job import (
    Command,
    QuotaSchedule,
    balance_config,
    run_dir,
    write_command,
)
from potluck_lab.bench.straggler_report import report_json, report_lines
from potluck_lab.common import BenchError, interleaved
from potluck_lab.driver import Bench, drive, given
from potluck_lab.jobs import Processes
from potluck_lab.machine.cpu_quota import CpuQuota, unavailable

CONTENDERS = ("ddp", "potluck", "balanced")
_JOB = "potluck_lab.bench.straggler_job"
_POLL_S = 0.01  # the bench's own CPU stays well under 1%; steps last 0.1 s or more
_START_S = 180.0  # for every worker to import torch and say hello
_STALL_S = 120.0  # a run with no new record for this long is stuck
_SKIP = 1  # solo: steps left out after a quota change (the one in flight is never counted)
# The workers' CPU weight: 16 ordinary processes'. Other work on the machine (tests, a
# build) then waits while they compute, instead of slowing one of them down at random.
_SHARES = 16384


@dataclass(frozen=True)
class StragglerConfig:
    workers: int = 2
    quota: float = 0.5
    rounds: int = 6
    warmup: int = 5  # steps of each run left out of its throughput
    steps: int = 10  # timed steps of each contender's run
    global_batch: int = 1024
    solo_steps: int = 10  # timed steps at each quota in a solo run
    phase_steps: int = 16  # steps at each quota in the quota-change run
    check_steps: int = 8
    check_batch: int = 256
    solo_after: bool = True  # the change run's ideals: solo runs before and after it
    low: float = 0.3
    high: float = 1.0
    period_us: int = 10_000
    smoothing: float | None = None  # BalanceConfig's for the balanced runs; None: default
    min_gain: float | None = None
    contenders: tuple[str, ...] = CONTENDERS
    logs: str | None = None

    @property
    def slow(self) -> int:
        return self.workers - 1

    def validated(self) -> StragglerConfig:
        if self.workers < 2:
            raise ConfigError(f"--workers {self.workers}: a straggler needs a peer, so use "
                              "at least 2 (e.g. --workers 2)")
        if not 0.1 <= self.quota <= 1.0:
            raise ConfigError(f"--quota {self.quota:g} must be a fraction of one core between "
                              "0.1 and 1, e.g. --quota 0.5")
        for flag, count in (("--rounds", self.rounds), ("--steps", self.steps)):
            if count < 1:
                raise ConfigError(f"{flag} {count} must be at least 1")
        if self.global_batch < 2 * self.workers:
            raise ConfigError(f"--global-batch {self.global_batch} is too small for "
                              f"{self.workers} workers: give at least {2 * self.workers}")
        for flag, value in (("--smoothing", self.smoothing), ("--min-gain", self.min_gain)):
            if value is not None and not 0 <= value < 1:
                raise ConfigError(f"{flag} {value:g} must be a fraction in [0, 1) (a "
                                  f"BalanceConfig field), e.g. {flag} 0.5")
        return self


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=2, help="workers per job (default 2)")
    parser.add_argument("--quota", type=float, default=0.5, metavar="Q",
                        help="the slow worker's share of one core (default 0.5)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds of the contenders (default 6; --quick 2)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per contender run (default 10; --quick 6)")
    parser.add_argument("--global-batch", type=int, default=1024, metavar="G",
                        help="samples per step, all workers together (default 1024)")
    parser.add_argument("--smoothing", type=float, default=None, metavar="S",
                        help="BalanceConfig(smoothing=S) for the balanced runs (default: "
                             "potluck's)")
    parser.add_argument("--min-gain", type=float, default=None, metavar="F",
                        help="BalanceConfig(min_gain=F) for the balanced runs (default: "
                             "potluck's)")
    parser.add_argument("--logs", metavar="DIR", help="keep the workers' records here")
    parser.add_argument("--quick", action="store_true", help="a short run (about a minute)")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the e2e test
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")


def config_from_args(args: argparse.Namespace) -> StragglerConfig:
    """Flags -> config; ``--quick`` (and the test's ``--tiny``) pick short defaults."""
    config = StragglerConfig(workers=args.workers, quota=args.quota,
                             global_batch=args.global_batch, logs=args.logs,
                             smoothing=args.smoothing, min_gain=args.min_gain)
    if args.tiny:
        config = replace(config, rounds=1, warmup=3, steps=3, global_batch=128,
                         solo_steps=3, phase_steps=6, check_steps=8, check_batch=256,
                         contenders=("ddp", "balanced"), solo_after=False)
    elif args.quick:
        config = replace(config, rounds=2, steps=6, solo_steps=6, phase_steps=10)
    return given(config, rounds=args.rounds, steps=args.steps).validated()


def main(args: argparse.Namespace) -> int:
    return drive(BENCH, args)


def measure_pool(config: StragglerConfig, logs: Path) -> dict[str, Any]:
    """The workers' cgroups and pool, every run on them, and the workers' pids."""
    name = f"potluck-straggler-{os.getpid()}"
    with CpuQuota(name, period_us=config.period_us, shares=_SHARES) as quota, \
            CpuQuota(f"{name}-fast", shares=_SHARES) as fast, \
            Pool(config, logs, quota, fast) as pool:
        return {**measure(config, pool, quota), "worker_pids": pool.pids}


Records = dict[int, list[dict[str, Any]]]  # rank -> its step records, in order
Watch = Callable[[list[dict[str, Any]]], "bool | None"]  # new records -> stop the run now?


class Pool:
    """The workers: started once, told what to run, stopped and reaped on exit."""

    def __init__(self, config: StragglerConfig, directory: Path, slow: CpuQuota,
                 fast: CpuQuota) -> None:
        self.config, self.directory, self.slow, self.fast = config, directory, slow, fast
        self._workers = Processes()
        self._runs = 0

    def __enter__(self) -> Pool:
        self.directory.mkdir(parents=True, exist_ok=True)
        environ = potluck_env.environ_copy()
        environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        try:
            for rank in range(self.config.workers):
                argv = [sys.executable, "-m", _JOB, "--dir", str(self.directory), "--rank",
                        str(rank), "--world-size", str(self.config.workers),
                        "--cpu", str(pool_cpu(rank))]
                group = self.slow if rank == self.config.slow else self.fast
                argv += ["--cgroup", str(group.path)]  # it moves itself in, before torch
                self._workers.start(argv, self.directory / f"worker-{rank}.log", env=environ)
            self._wait_for_hellos()
        except BaseException:
            self.close(graceful=False)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close(graceful=kind is None)

    @property
    def pids(self) -> list[int]:
        return self._workers.pids

    def _wait_for_hellos(self) -> None:
        # Imported once the workers are on their way: potluck.metrics imports torch (3 s).
        from potluck.metrics.journal import read_journal

        deadline = time.monotonic() + _START_S
        while len(read_journal(self.directory / "workers.jsonl")) < self.config.workers:
            self._check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"the workers did not start within {_START_S:.0f} s; their "
                                 f"output is in {self.directory}/worker-*.log")
            time.sleep(0.05)

    def run(self, contender: str, *, steps: int, batch: int, dtype: str = "float32",
            check: bool = False, watch: Watch | None = None) -> tuple[Records, Records]:
        """One run on every worker: (step records, done records) by rank. ``watch`` sees
        each poll's new records and may stop the run (``solo`` runs stop that way)."""
        from potluck.metrics.journal import JournalFollower
        from potluck.testing import free_port

        command = Command(self._runs, contender, free_port(), steps, batch, dtype, check,
                          self.config.smoothing, self.config.min_gain)
        self._runs += 1
        folder = run_dir(self.directory, command.index)
        write_command(self.directory, command)
        follower = JournalFollower(folder)
        records: Records = {rank: [] for rank in range(self.config.workers)}
        done: Records = {}
        heard, stopped = time.monotonic(), False
        while len(done) < self.config.workers:
            new = follower.poll()
            for record in new:
                (done if record["kind"] == "done" else records).setdefault(
                    int(record["rank"]), []).append(record)
            if watch is not None and not stopped and watch(new):
                (folder / "stop").touch()
                stopped = True
            heard = time.monotonic() if new else heard
            self._check_alive()
            if time.monotonic() - heard > _STALL_S:
                raise BenchError(f"{contender} run {command.index}: no step for "
                                 f"{_STALL_S:.0f} s; the workers' logs are in {folder}")
            time.sleep(_POLL_S)
        return records, done

    def _check_alive(self) -> None:
        for rank in self._workers.ended():
            proc = self._workers.procs[rank]
            error = self.directory / f"error-{rank}.txt"
            why = error.read_text() if error.exists() else "(no traceback written)"
            raise BenchError(f"worker {rank} (pid {proc.pid}, CPU {pool_cpu(rank)}) exited "
                             f"with code {proc.returncode}:\n{why[-3000:].rstrip()}\n"
                             f"logs: {self.directory}")

    def close(self, *, graceful: bool = True) -> None:
        """Ask every (idle) worker to leave, then kill and reap those still there; after
        an error or Ctrl-C, kill them at once (one may be in the middle of a run)."""
        with contextlib.suppress(OSError):
            (self.directory / "stop").touch()
        self._workers.stop(10 if graceful else 0)


def measure(config: StragglerConfig, pool: Pool, quota: CpuQuota) -> dict[str, Any]:
    """Every run: the rounds (solo and contenders, interleaved), the quota change between
    two solo runs at its quotas, the float64 check."""
    rounds: list[dict[str, Any]] = [{} for _ in range(config.rounds)]
    names = ["solo", *config.contenders]
    for index, name in enumerate(interleaved(names, config.rounds)):
        rounds[index // len(names)][name] = (
            solo_run(config, pool, quota, [config.quota])[0] if name == "solo"
            else contender_run(config, pool, quota, name))
    return {"rounds": rounds, "change": change_run(config, pool, quota),
            "check": check_run(config, pool, quota)}


def solo_run(config: StragglerConfig, pool: Pool, quota: CpuQuota,
             fractions: list[float]) -> list[dict[str, Any]]:
    """Every worker alone, all at once (the machine as loaded as in a job), the slow one
    at each of ``fractions`` in turn for ``solo_steps`` timed steps. Per quota: every
    rank's samples/s while the slow one ran at it, and their sum (the ideal)."""
    slow, n = config.slow, config.solo_steps
    ends = [config.warmup + n + i * (1 + _SKIP + n) for i in range(len(fractions))]
    schedule = QuotaSchedule(quota, slow, list(zip([e - 1 for e in ends], fractions[1:],
                                                   strict=False)))

    def watch(new: list[dict[str, Any]]) -> bool:
        schedule.feed(new)
        return any(int(r["rank"]) == slow and int(r["step"]) >= ends[-1] - 1 for r in new)

    quota.set(fractions[0])
    records, _ = pool.run("solo", steps=1_000_000, batch=config.global_batch, watch=watch)
    starts = [max(fig.after_warmup(steps, config.warmup) for steps in records.values()),
              *(at for at, _ in schedule.applied)]
    ranked = [records[r] for r in range(config.workers)]
    rates = fig.phase_rates(ranked, config.global_batch // config.workers, starts, skip=_SKIP)
    ceilings = _ceilings(config, ranked, starts)
    return [{"quota": q, "samples_per_s": r, "ideal": math.fsum(r), "sync_ceiling": c}
            for q, r, c in zip(fractions, rates, ceilings, strict=True)]


def _ceilings(config: StragglerConfig, ranked: list[list[dict[str, Any]]],
              starts: list[float]) -> list[dict[str, Any]]:
    """Per phase of a solo run, on the solos' own timelines (``sync_ceiling``): potluck's
    planner replayed (``planner``: counted after the bench's warm-up, as a job's run),
    and the best fixed split's synchronous rate over the same stretch (``rate``,
    ``fraction``): how much of the ideal the machine's step-to-step noise leaves."""
    # (imported here: it imports torch, which the bench must not wait for at its start)
    from potluck_lab.bench import sync_ceiling as sync

    lines = [sync.Timeline(fig.spans(steps), config.global_batch // config.workers)
             for steps in ranked]
    balance = balance_config(config.smoothing, config.min_gain)
    ends = [*starts[1:], min(line.end for line in lines)]
    out: list[dict[str, Any]] = []
    for start, end in zip(starts, ends, strict=True):
        try:
            model = sync.BalancerModel(config.workers, config.global_batch, balance)
            planned = sync.replay_policy(lines, model, start, end, warmup=config.warmup)
            since = planned.start if planned.samples else start  # (too short: the whole)
            best = sync.ceiling(lines, config.slow, config.global_batch, since, end)
        except ValueError:  # a phase outside a timeline: nothing to replay
            out.append({"rate": math.nan, "split": [], "fraction": math.nan,
                        "planner": math.nan})
            continue
        out.append({**best, "planner": sync.fraction(lines, planned)})
    return out


def contender_run(config: StragglerConfig, pool: Pool, quota: CpuQuota,
                  name: str) -> dict[str, Any]:
    quota.set(config.quota)
    records, _ = pool.run(name, steps=config.warmup + config.steps, batch=config.global_batch)
    lead = records[0]
    return {"samples_per_s": fig.rate(fig.spans(lead), config.global_batch,
                                      start=fig.after_warmup(lead, config.warmup)),
            "split": lead[-1]["split"],
            "time_split": [fig.time_split(records[rank], config.warmup) for rank in records]}


def change_run(config: StragglerConfig, pool: Pool, quota: CpuQuota) -> dict[str, Any]:
    """Balanced, the slow worker at the high quota, then the low one, then high again;
    the ideals from solo runs at those quotas just before and just after. Also how many
    steps it took to settle near its own later pace (the balancer's reaction alone)."""
    phase, batch = config.phase_steps, config.global_batch
    down, up = config.warmup + phase, config.warmup + 2 * phase
    before = solo_run(config, pool, quota, [config.low, config.high])
    schedule = QuotaSchedule(quota, 0, [(down - 1, config.low), (up - 1, config.high)])
    quota.set(config.high)
    records, _ = pool.run("balanced", steps=up + phase, batch=batch, watch=schedule.feed)
    after = solo_run(config, pool, quota, [config.low, config.high]) if config.solo_after \
        else before
    ideals = [(a["ideal"] + b["ideal"]) / 2 for a, b in zip(before, after, strict=True)]
    figures = fig.change_figures(fig.spans(records[0]), batch, [at for at, _ in schedule.applied],
                                 ideals, tolerance=fig.TOLERANCE, hold=fig.HOLD)
    return {**figures, "changes": [{"time": t, "quota": q} for t, q in schedule.applied],
            "solo_before": before, "solo_after": after, "ideal_samples_per_s": ideals,
            "splits": [r["split"] for r in records[0]],
            "speeds": [r["speeds"] for r in records[0]]}


def check_run(config: StragglerConfig, pool: Pool, quota: CpuQuota) -> dict[str, Any]:
    """float64, balanced, the slow worker at Q: the parameters against one process."""
    quota.set(config.quota)
    records, done = pool.run("balanced", steps=config.check_steps, batch=config.check_batch,
                             dtype="float64", check=True)
    splits = [r["split"] for r in records[0]]
    return {"max_param_diff": float(done[0][0]["max_param_diff"]), "splits": splits,
            "shares_moved": any(s != splits[0] for s in splits)}


def _lines(config: StragglerConfig, results: dict[str, Any]) -> list[str]:
    """The header, the throughput table, where the time goes, the figure lines."""
    return report_lines(config, results, [pool_cpu(r) for r in range(config.workers)])


def pool_cpu(rank: int) -> int:
    """The CPU rank ``rank`` is pinned to: this process's CPUs in turn."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[rank % len(cpus)]



BENCH = Bench("straggler", config_from_args, measure_pool, _lines, report_json,
              unavailable=unavailable, logs=lambda config: config.logs,
              stopped="every worker was stopped")
