"""``potluck bench chaos``: random faults and joins at random steps, trial after trial.

A trial runs the ``elastic_job`` with 3 founders and one more worker. The plan, drawn
from the trial's seed, picks a founder (the victim), what happens to it at a random
step (SIGKILL; SIGSTOP, a freeze; SIGTERM, a graceful leave) and when the fourth worker
arrives: at a random moment ("late"), or as soon as the victim's fault happened
("replacement", as the launcher restarts a lost worker). The store lives in this
process, as in the launcher's agent. A trial passes when:

- every worker but the victim completes (a leaver completes too, having left);
- every sample of every epoch was committed exactly once (ledger);
- the finishers' replicas are identical and equal one process training on the same
  global batches (float64, ``rtol=1e-9``: only summation order differs);
- no worker process is left behind.

``run_trial`` is what ``tests/distributed/test_chaos.py`` calls for its CI seeds.

``--faults store-host`` runs another kind of trial instead: a multi-node job whose
store's host is killed (``chaos_store_host``). ``--churn --members 4,8,16,32`` runs one
job per member count, members killed and joining for ``--minutes`` (``chaos_churn``).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from potluck.errors import ConfigError
from potluck.testing import Faults, RankFailed, exactly_once_problems, free_port, run_ranks
from potluck_lab.bench import chaos_churn, chaos_store_host
from potluck_lab.bench.trial_checks import TrialChecks
from potluck_lab.common import at_least
from potluck_lab.driver import Bench, drive
from potluck_lab.elastic_job import (
    ElasticJob,
    leftover_processes,
    max_param_diff,
    single_process,
    start_worker,
    train,
    write_pid,
)

FOUNDERS = 3
FAULTS = ("kill", "stop", "leave")
JOB = ElasticJob(epochs=6, token="chaos", collective_timeout=4.0, step_pause=0.15)
RTOL, ATOL = 1e-9, 1e-12


@dataclass(frozen=True)
class ChaosPlan:
    """What goes wrong in one trial, drawn from its seed."""

    seed: int
    victim: int  # a founder's rank
    fault: str  # one of FAULTS
    at: int  # committed steps when the fault strikes
    joiner: str  # "late" (after join_after seconds) or "replacement" (after the fault)
    join_after: float

    @classmethod
    def from_seed(cls, seed: int) -> ChaosPlan:
        rng = random.Random(seed)
        return cls(seed=seed, victim=rng.randrange(FOUNDERS), fault=rng.choice(FAULTS),
                   at=rng.randint(2, 10), joiner=rng.choice(["late", "replacement"]),
                   join_after=round(rng.uniform(0.5, 2.5), 2))

    def faults(self) -> Faults:
        """The kill or the freeze for good, as ``potluck.testing`` injects them. A leave
        is a SIGTERM the worker answers by leaving: ``Faults`` has no such kind."""
        if self.fault == "kill":
            return Faults().kill(self.victim, self.at)
        if self.fault == "stop":
            return Faults().freeze(self.victim, self.at)
        return Faults()

    def describe(self) -> str:
        joiner = (f"joiner after {self.join_after:g} s" if self.joiner == "late"
                  else "replacement joins after the fault")
        return f"rank {self.victim} {self.fault} at step {self.at}, {joiner}"


@dataclass
class TrialResult(TrialChecks):
    plan: ChaosPlan
    recovery_s: list[tuple[str, float]] = field(default_factory=list)

    def line(self) -> str:
        recovery = ", ".join(f"{c} {s:.2f} s" for c, s in self.recovery_s) or "-"
        return (f"seed {self.plan.seed}: {self.plan.describe()} | "
                f"completed {_yes(self.completed)} | exactly-once {_yes(self.exactly_once)} | "
                f"max |param diff| {self.max_param_diff:.1e} | "
                f"replicas equal {_yes(self.replicas_equal)} | recovery {recovery} | "
                f"leftover processes {len(self.leftover)} | {self.seconds:.1f} s | "
                f"{'PASS' if self.passed else 'FAIL'}")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        return out


def run_trial(seed: int, workdir: Path, job: ElasticJob = JOB,
              timeout: float = 200.0) -> TrialResult:
    """One chaos trial in ``workdir`` (ledgers, pid files); never raises for a failed run."""
    from torch._C._distributed_c10d import TCPStore

    plan, started = ChaosPlan.from_seed(seed), time.monotonic()
    trial = TrialResult(plan)
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=30))
    try:
        results = run_ranks(_rank, FOUNDERS + 1, port, str(workdir), plan, job,
                            init_group=False, may_die={plan.victim}, timeout=timeout)
    except RankFailed as exc:
        trial.problems.append(str(exc))
        results = []
    finally:
        trial.leftover = _wait_gone(workdir)
        del store
    if results:
        _check(trial, results, workdir, job)
    trial.seconds = time.monotonic() - started
    return trial


def _check(trial: TrialResult, results: list[Any], workdir: Path, job: ElasticJob) -> None:
    plan = trial.plan
    trial.problems += [r["error"] for r in results if r is not None and "error" in r]
    if trial.problems:
        return
    finishers = [r for rank, r in enumerate(results) if rank != plan.victim]
    victim = results[plan.victim]
    trial.completed = all(r is not None and not r["left"] for r in finishers) and (
        plan.fault != "leave" or (victim is not None and victim["left"]))
    trial.exactly_once = not (
        problems := exactly_once_problems(workdir, job.samples, job.epochs))
    trial.problems += problems
    if not trial.completed:
        trial.problems.append("a worker did not complete")
        return
    expected = single_process(job)
    first = finishers[0]["params"]
    trial.max_param_diff = max(max_param_diff(r["params"], expected) for r in finishers)
    trial.replicas_equal = all(max_param_diff(r["params"], first) == 0.0 for r in finishers)
    for r in finishers:
        for name, value in expected.items():
            if not torch.allclose(r["params"][name], value, rtol=RTOL, atol=ATOL):
                trial.problems.append(f"{name} differs from one process")
    reporter = max(finishers, key=lambda r: len(r["events"]))  # a surviving founder
    trial.recovery_s = [(_cause(e), round(e["recovery_s"], 3)) for e in reporter["events"]]


def _rank(rank: int, world_size: int, port: int, workdir: str, plan: ChaosPlan,
          job: ElasticJob) -> dict[str, Any]:
    """One worker; an exception is returned, not raised, so every rank's end is seen."""
    try:
        return _train_rank(rank, port, Path(workdir), plan, job)
    except Exception:
        return {"error": f"rank {rank} (pid {os.getpid()}): {traceback.format_exc()}"}


def _train_rank(rank: int, port: int, directory: Path, plan: ChaosPlan,
                job: ElasticJob) -> dict[str, Any]:
    write_pid(directory, f"rank{rank}")

    def arrive() -> None:  # the extra worker's moment
        if plan.joiner == "late":
            time.sleep(plan.join_after)
        else:
            _wait_for(directory / "fault", deadline=job.join_timeout)

    worker = start_worker(job, f"worker-{rank}", "127.0.0.1", port,
                          before_join=arrive if rank == FOUNDERS else None)
    inject = plan.faults().injector(rank)

    def fault(steps: int) -> None:
        if rank != plan.victim or steps != plan.at or (directory / "fault").exists():
            return
        (directory / "fault").write_text(plan.fault)  # the replacement's cue
        if plan.fault == "leave":  # a graceful leave: the worker finishes its step first
            worker.optimizer.leave_on_sigterm()
            os.kill(os.getpid(), signal.SIGTERM)
        inject(steps)

    return train(worker, job, directory / f"rank{rank}.jsonl", fault)


def _wait_for(path: Path, deadline: float) -> None:
    end = time.monotonic() + deadline
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.05)


def _wait_gone(workdir: Path, grace: float = 5.0) -> list[int]:
    """Worker processes still running ``grace`` seconds after the run was reaped."""
    end = time.monotonic() + grace
    while (alive := leftover_processes(workdir)) and time.monotonic() < end:
        time.sleep(0.1)
    return alive


def _cause(event: dict[str, Any]) -> str:
    """"lost" (a failed step's recovery), or "joined" / "left" at a step boundary."""
    if event["cause"] != "boundary":
        return "lost"
    return "+".join(k for k in ("left", "joined") if event[k])


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=4, help="how many trials")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the first trial; trial i uses seed + i")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--faults", choices=FAULT_KINDS, default="workers",
                        help="workers: a worker killed, frozen or leaving, and a joiner "
                             "(the default); store-host: the store's host (its agent "
                             "and worker) killed in a 3-node job")
    parser.add_argument("--churn", action="store_true",
                        help="many loopback nodes, members killed and joining every few "
                             "seconds (one run per --members count)")
    parser.add_argument("--members", default="8", metavar="N[,N...]",
                        help="--churn: the member counts, one run each (default 8)")
    parser.add_argument("--minutes", type=float, default=10.0,
                        help="--churn: minutes of churn per run (default 10)")
    parser.add_argument("--logs", metavar="DIR",
                        help="keep every run's logs (each node's output, the traces) here")


FAULT_KINDS = ("workers", "store-host")


@dataclass(frozen=True)
class ChaosBenchConfig:
    trials: int
    seed: int  # the first trial's; trial i uses seed + i
    faults: str = "workers"  # one of FAULT_KINDS
    members: tuple[int, ...] = ()  # --churn: one run per count (empty: trials)
    minutes: float = 10.0
    logs: str | None = None  # kept here (else removed after the run)


def config_from_args(args: argparse.Namespace) -> ChaosBenchConfig:
    at_least("--trials", args.trials, 1, "4")
    if not args.churn:
        return ChaosBenchConfig(args.trials, args.seed, args.faults, logs=args.logs)
    if args.faults != "workers":
        raise ConfigError(f"--churn with --faults {args.faults}: churn kills and adds "
                          "workers; run the store-host trials on their own")
    try:
        members = tuple(int(n) for n in args.members.split(","))
    except ValueError:
        raise ConfigError(f"--members {args.members!r} must be counts separated by "
                          "commas, e.g. --members 4,8,16,32") from None
    for count in members:
        # (a kill must leave a majority of the last generation: the quorum)
        at_least("--members", count, 3, "8")
    if not args.minutes > 0:
        raise ConfigError(f"--minutes {args.minutes:g} must be positive, e.g. --minutes 10")
    return ChaosBenchConfig(args.trials, args.seed, members=members, minutes=args.minutes,
                            logs=args.logs)


def main(args: argparse.Namespace) -> int:
    return drive(BENCH, args)


Trial = TrialResult | chaos_store_host.StoreHostResult | chaos_churn.ChurnResult


def run_trials(config: ChaosBenchConfig, logs: Path) -> list[Trial]:
    """Every trial in turn (or churn run), each line printed as it ends."""
    if config.members:
        return list(_churn_runs(config, logs))
    trials: list[Trial] = []
    for i in range(config.trials):
        seed, workdir = config.seed + i, logs / f"trial{i}"
        trial = (chaos_store_host.run_trial(seed, workdir) if config.faults == "store-host"
                 else run_trial(seed, workdir))
        trials.append(trial)
        print(f"trial {i + 1}/{config.trials} {trial.line()}", flush=True)
        for problem in trial.problems:
            print(f"    {problem}", flush=True)
    return trials


def _churn_runs(config: ChaosBenchConfig, logs: Path) -> list[chaos_churn.ChurnResult]:
    runs = []
    for count in config.members:
        run = chaos_churn.run_churn(count, 60 * config.minutes, config.seed,
                                    logs / f"members{count}")
        runs.append(run)
        print(run.line(), flush=True)
        for problem in run.problems:
            print(f"    {problem}", flush=True)
    return runs


def _header(config: ChaosBenchConfig) -> str:
    if config.members:
        return chaos_churn.header(list(config.members), 60 * config.minutes, config.seed)
    if config.faults == "store-host":
        return (f"potluck bench chaos --faults store-host: {config.trials} trial(s) from "
                f"seed {config.seed}; {chaos_store_host.header()}")
    return (f"potluck bench chaos: {config.trials} trial(s) from seed {config.seed}; "
            f"{FOUNDERS} founders + 1 joiner, gloo, {JOB.epochs} epochs of "
            f"{JOB.samples // JOB.global_batch} steps, collective timeout "
            f"{JOB.collective_timeout:g} s")


def _passed(trials: list[Trial]) -> int:
    return sum(t.passed for t in trials)


def _lines(config: ChaosBenchConfig, trials: list[Trial]) -> list[str]:
    if config.members:
        return chaos_churn.summary(_churned(trials))
    return [f"{_passed(trials)}/{len(trials)} trials passed",
            *chaos_store_host.summary(trials)]


def _payload(config: ChaosBenchConfig, trials: list[Trial]) -> dict[str, Any]:
    if config.members:
        return chaos_churn.payload(_churned(trials), 60 * config.minutes, config.seed)
    return {"job": asdict(JOB) if config.faults == "workers" else {"faults": config.faults},
            "passed": _passed(trials), "trials": [t.as_dict() for t in trials]}


def _churned(trials: list[Trial]) -> list[chaos_churn.ChurnResult]:
    return [t for t in trials if isinstance(t, chaos_churn.ChurnResult)]


BENCH = Bench("chaos", config_from_args, run_trials, _lines, _payload,
              header=_header, logs=lambda config: config.logs,
              exit_code=lambda trials: 0 if _passed(trials) == len(trials) else 1)
