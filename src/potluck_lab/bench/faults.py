"""potluck elastic vs torchrun restart-from-checkpoint, with a worker SIGKILLed every T s.

Four contenders run the same job (``faults_job``: a float32 MLP, a constant global
batch, a fixed number of global steps) one after the other, interleaved over rounds:

- ``potluck``, ``potluck+kills``: ``potluck run --elastic``; a killed worker's step is
  redone by the survivors, the launcher restarts it alone and it rejoins live.
- ``torchrun``, ``torchrun+kills``: ``torch.distributed.run`` with plain DDP, a
  checkpoint every C steps; on a kill torchrun restarts every worker from the newest.

This process is the killer: once every worker trains (``workers.jsonl``) and the job has
committed at full strength for T seconds and C + 1 steps (``kill_due``), it SIGKILLs one
(the same sequence of launch ranks for both systems); never a few seconds before the end.
The figures come from the logs (``faults_figures``). Every process is reaped on success,
failure and Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from potluck import env as potluck_env
from potluck.errors import ConfigError
from potluck.metrics.journal import Journal, read_journal
from potluck_lab.bench.faults_figures import RunFigures, run_figures, summarize
from potluck_lab.common import BenchError, table
from potluck_lab.driver import Bench, Run, drive, ratio, run_interleaved
from potluck_lab.jobs import Processes

CONTENDERS = ("potluck", "potluck+kills", "torchrun", "torchrun+kills")
_JOB = "potluck_lab.bench.faults_job"
_POLL = 0.05
_FINISH_GRACE_S = 4.0  # after "done": a restarted worker may wait for a finished cohort
_MAX_RESTARTS = 50
_STALL_S = 120.0  # no new step for this long: the job is stuck
Runs = list[Run[dict[str, Any]]]  # each run's figures, job_s and pids


@dataclass(frozen=True)
class FaultsConfig:
    workers: int = 3
    steps: int = 200
    kill_every: float = 8.0
    checkpoint_every: int = 10
    rounds: int = 1
    heartbeat_timeout: float = 1.5
    collective_timeout: float = 5.0
    end_margin: float = 2.0
    """No kill when the job is expected to end within this many seconds."""
    step_pause: float = 0.0  # a sleep per step: a floor on a job's length (tests)
    max_kills: int = 0  # kills per run at most (0: as many as kill_every allows)
    seed: int = 0
    logs: str | None = None
    contenders: tuple[str, ...] = CONTENDERS

    @property
    def global_batch(self) -> int:
        return 64 * self.workers

    def validated(self) -> FaultsConfig:
        if self.workers < 2:
            raise ConfigError(f"--workers {self.workers}: a kill must leave a survivor, so "
                              "use at least 2 (e.g. --workers 3)")
        for flag, value in (("--steps", self.steps), ("--checkpoint-every",
                            self.checkpoint_every), ("--rounds", self.rounds)):
            if value < 1:
                raise ConfigError(f"{flag} {value} must be at least 1")
        unknown = [name for name in self.contenders if name not in CONTENDERS]
        if unknown or not self.contenders:
            raise ConfigError(f"--contenders {','.join(self.contenders)}: pick from "
                              f"{','.join(CONTENDERS)}, comma-separated (e.g. --contenders "
                              "potluck,potluck+kills)")
        if not self.kill_every > 0:
            raise ConfigError(f"--kill-every {self.kill_every:g} must be a positive number of "
                              "seconds between kills, e.g. --kill-every 8")
        for flag, seconds in (("--heartbeat-timeout", self.heartbeat_timeout),
                              ("--collective-timeout", self.collective_timeout)):
            if not seconds > 0:
                raise ConfigError(f"{flag} {seconds:g} must be a positive number of "
                                  "seconds, e.g. 2")
        if not self.step_pause >= 0:
            raise ConfigError(f"--step-pause {self.step_pause:g} must be seconds >= 0")
        if self.max_kills < 0:
            raise ConfigError(f"--max-kills {self.max_kills} must be a count >= 0 (0: no "
                              "cap), e.g. --max-kills 3")
        return self


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=3, help="workers per job (default 3)")
    parser.add_argument("--steps", type=int, default=None,
                        help="global steps every job commits (default 300; --quick 100)")
    parser.add_argument("--kill-every", type=float, default=None, metavar="T",
                        help="seconds of full-strength training between two kills "
                             "(default 6; --quick 2)")
    parser.add_argument("--checkpoint-every", type=int, default=10, metavar="C",
                        help="torchrun contender: checkpoint every C steps (default 10)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds of the four contenders (default 1; 3 or more "
                             "for figures that hold on a noisy machine)")
    parser.add_argument("--heartbeat-timeout", type=float, default=1.5, metavar="S",
                        help="potluck job: seconds until a silent worker counts as gone")
    parser.add_argument("--collective-timeout", type=float, default=5.0, metavar="S",
                        help="potluck job: seconds before a collective fails (default 5)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), metavar="A,B",
                        help="which of the four to run (default all; goodput needs a "
                             "system's run without kills beside its run with them)")
    parser.add_argument("--seed", type=int, default=0, help="which workers get killed")
    parser.add_argument("--logs", metavar="DIR", help="keep every run's logs here")
    parser.add_argument("--max-kills", type=int, default=0, metavar="K",
                        help="kills per run at most, so that both systems are killed the "
                             "same number of times (default 0: as many as --kill-every "
                             "allows)")
    parser.add_argument("--step-pause", type=float, default=0.0, metavar="S",
                        help="seconds of sleep per step, a stand-in for compute, so that a "
                             "job lasts long enough for its kills on a fast machine")
    parser.add_argument("--quick", action="store_true", help="a short run (about a minute)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")


def config_from_args(args: argparse.Namespace) -> FaultsConfig:
    """Flags -> config; ``--quick`` picks short defaults for the flags not given."""
    steps, kill_every, rounds = (100, 2.0, 1) if args.quick else (300, 6.0, 1)
    return FaultsConfig(
        workers=args.workers,
        steps=steps if args.steps is None else args.steps,
        kill_every=kill_every if args.kill_every is None else args.kill_every,
        checkpoint_every=args.checkpoint_every,
        rounds=rounds if args.rounds is None else args.rounds,
        heartbeat_timeout=args.heartbeat_timeout, collective_timeout=args.collective_timeout,
        seed=args.seed, logs=args.logs, step_pause=args.step_pause,
        max_kills=args.max_kills,
        contenders=tuple(name.strip() for name in args.contenders.split(",") if name.strip()),
    ).validated()


def main(args: argparse.Namespace) -> int:
    return drive(BENCH, args)


def summaries(config: FaultsConfig, runs: Runs) -> dict[str, dict[str, Any]]:
    """Each contender's figures over its rounds (goodput against its run without kills)."""
    figures = {name: [r.result["figures"] for r in runs if r.contender == name]
               for name in CONTENDERS}
    return {name: summarize(figures[name], figures[name.split("+")[0]]
                            if name.endswith("+kills") else ())
            for name in CONTENDERS if name in config.contenders}


def ratios(summary: dict[str, dict[str, Any]]) -> dict[str, float]:
    """potluck over torchrun, with kills and without (NaN: a contender not run)."""
    absent = summarize([], [])  # every figure NaN
    ours, theirs = (summary.get(name, absent) for name in ("potluck+kills", "torchrun+kills"))
    calm = {name: summary.get(name, absent) for name in ("potluck", "torchrun")}
    return {
        "goodput_potluck_over_torchrun": ratio(ours["goodput"], theirs["goodput"]),
        "recovery_potluck_over_torchrun": ratio(ours["recovery_median_s"],
                                                theirs["recovery_median_s"]),
        "steps_per_s_potluck_over_torchrun_kills": ratio(ours["steps_per_s"],
                                                         theirs["steps_per_s"]),
        "steps_per_s_potluck_over_torchrun_no_kills": ratio(
            calm["potluck"]["steps_per_s"], calm["torchrun"]["steps_per_s"]),
    }


def report_lines(config: FaultsConfig, runs: Runs) -> list[str]:
    """The header, the table and the ratio lines."""
    summary = summaries(config, runs)
    ratio_of = {key: _fmt(value) for key, value in ratios(summary).items()}
    cap = f" (at most {config.max_kills} a run)" if config.max_kills else ""
    return [
        f"potluck bench faults: {config.workers} workers, gloo, kill every "
        f"{config.kill_every:g} s{cap}, {config.steps} steps of {config.global_batch} samples, "
        f"torchrun checkpoint every {config.checkpoint_every} steps, "
        f"{config.rounds} interleaved round(s)",
        table(["contender", "kills", "steps lost", "redone", "recovery (s)", "max (s)",
               f"back to {config.workers} (s)", "wall (s)", "steps/s", "goodput"],
              [[name, s["kills"], s["steps_lost"], s["redone"], s["recovery_median_s"],
                s["recovery_max_s"], s["whole_median_s"], s["wall_s"], s["steps_per_s"],
                s["goodput"]] for name, s in summary.items()]),
        f"with kills, potluck/torchrun: goodput {ratio_of['goodput_potluck_over_torchrun']}"
        f", recovery time {ratio_of['recovery_potluck_over_torchrun']}, steps/s "
        f"{ratio_of['steps_per_s_potluck_over_torchrun_kills']}",
        f"without kills, potluck/torchrun: steps/s "
        f"{ratio_of['steps_per_s_potluck_over_torchrun_no_kills']}",
    ]


def report_json(config: FaultsConfig, runs: Runs) -> dict[str, Any]:
    """The config, each contender's figures, the ratios, and every run's figures."""
    summary = summaries(config, runs)
    return {"config": {**asdict(config), "global_batch": config.global_batch},
            "contenders": summary, "ratios": ratios(summary),
            "runs": [{"contender": r.contender, "round": r.round, "job_s": r.result["job_s"],
                      "launcher_pid": r.result["launcher_pid"],
                      "worker_pids": r.result["worker_pids"],
                      **asdict(r.result["figures"]),
                      "steps_per_s": r.result["figures"].steps_per_s}
                     for r in runs]}


def _fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3g}"


def run_all(config: FaultsConfig, logs: Path) -> Runs:
    """Every contender ``rounds`` times, interleaved."""
    def run(name: str, round_: int) -> dict[str, Any]:
        run_dir = logs / f"{round_}-{name.replace('+', '-')}"
        victims = random.Random(config.seed * 1000 + round_)  # same sequence per system
        figures, pids = run_contender(name, config, run_dir, victims)
        return {"figures": figures, **pids}

    return run_interleaved(config.contenders, config.rounds, run)


BENCH = Bench("faults", config_from_args, run_all, report_lines, report_json,
              logs=lambda config: config.logs)


def run_contender(name: str, config: FaultsConfig, run_dir: Path,
                  victims: random.Random) -> tuple[RunFigures, dict[str, Any]]:
    run_dir.mkdir(parents=True, exist_ok=True)
    kills: list[float] = []
    started = time.monotonic()
    job = Processes()
    # In a session of its own: stopping its group stops the workers it started too.
    launcher = job.start(_command(name, config, run_dir), run_dir / "launcher.log",
                         env=_environ())
    try:
        _drive(launcher, name, config, run_dir, kills, victims)
    finally:
        workers = _reap(job, run_dir)
    figures = run_figures(_commit_records(run_dir), kills, world_size=config.workers)
    if not figures.done or figures.steps != config.steps:
        raise BenchError(f"{name}: the job committed {figures.steps} of {config.steps} steps "
                         f"(launcher exit code {launcher.returncode}); its output ends with:"
                         f"\n{_tail(run_dir / 'launcher.log')}\nlogs: {run_dir}")
    return figures, {"job_s": time.monotonic() - started, "launcher_pid": launcher.pid,
                     "worker_pids": workers}


def _command(name: str, config: FaultsConfig, run_dir: Path) -> list[str]:
    job = ["-m", _JOB, "--run-dir", str(run_dir), "--steps", str(config.steps),
           "--global-batch", str(config.global_batch), "--step-pause", str(config.step_pause)]
    workers, restarts = str(config.workers), str(_MAX_RESTARTS)
    if name.startswith("potluck"):
        return [sys.executable, "-m", "potluck", "run", "--elastic",
                "--token", secrets.token_hex(8), "--nproc-per-node", workers,
                "--max-restarts", restarts, "--grace-period", "2", *job,
                "--mode", "elastic", "--heartbeat-timeout", str(config.heartbeat_timeout),
                "--collective-timeout", str(config.collective_timeout)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", workers, "--max-restarts", restarts, *job,
            "--mode", "checkpoint", "--checkpoint-every", str(config.checkpoint_every)]


def _environ() -> dict[str, str]:
    environ = potluck_env.environ_copy()
    # torchrun shares its rendezvous store with the workers by default, and a restarted
    # Gloo group then reads the previous attempt's peer addresses: every restart fails
    # with "connectFullMesh ... Connection refused" (pytorch/pytorch#135712, still so in
    # torch 2.13). Users turn the sharing off; so does the bench.
    environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return environ


def _drive(launcher: subprocess.Popen[bytes], name: str, config: FaultsConfig,
           run_dir: Path, kills: list[float], victims: random.Random) -> None:
    """Wait for the job to end, SIGKILLing a worker now and then (``_maybe_kill``).
    A job that commits no step beyond its highest for ``_STALL_S`` seconds is stuck."""
    progress_at, high, done_at = time.monotonic(), -1, None
    while launcher.poll() is None:
        now = time.monotonic()
        records = _commit_records(run_dir)
        if done_at is None and any(r["kind"] == "done" for r in records):
            done_at = now
        if done_at is not None and now - done_at > _FINISH_GRACE_S:
            return  # _reap stops whatever is left (the job calls finish(): nothing should be)
        commits = sorted((r for r in records if r["kind"] == "step"),
                         key=lambda r: float(r["time"]))
        newest = max((int(r["step"]) for r in commits), default=-1)
        if newest > high:
            progress_at, high = now, newest
        elif now - progress_at > _STALL_S:
            raise BenchError(f"{name}: no step beyond step {high} for {_STALL_S:g} s; the job "
                             f"is stuck. Its output ends with:\n"
                             f"{_tail(run_dir / 'launcher.log')}")
        if name.endswith("+kills") and commits and done_at is None:
            _maybe_kill(config, run_dir, commits, kills, victims)
        time.sleep(_POLL)


def kill_due(config: FaultsConfig, commits: list[dict[str, Any]], kills: list[float],
             now: float) -> bool:
    """Whether the job has trained at full strength long enough for the next kill (pure).

    Full strength: commits with every worker in, of a generation after the last kill
    (a commit of the old generation can land just after it). The next kill waits for
    ``kill_every`` seconds from the first such commit *and* for ``checkpoint_every + 1``
    of them, so that a job restarted from a checkpoint always gets past its next one: a
    wall-clock period alone, shorter than ``checkpoint_every`` steps on a slow machine,
    would keep torchrun at its checkpoint for ever. No kill within ``end_margin``
    seconds of the expected end (a restarted worker could find the job gone).
    """
    last_kill = kills[-1] if kills else -math.inf
    gone = max((int(r["generation"]) for r in commits if float(r["time"]) <= last_kill),
               default=-1)
    whole = [r for r in commits
             if int(r["workers"]) >= config.workers and int(r["generation"]) > gone]
    if len({int(r["step"]) for r in whole}) < config.checkpoint_every + 1:
        return False
    if now < float(whole[0]["time"]) + config.kill_every:
        return False
    latest = sorted({int(r["step"]): float(r["time"]) for r in commits}.items())[-11:]
    step_s = (latest[-1][1] - latest[0][1]) / max(1, len(latest) - 1)  # roughly
    return (config.steps - 1 - latest[-1][0]) * step_s >= config.end_margin  # steps from 0


def _maybe_kill(config: FaultsConfig, run_dir: Path, commits: list[dict[str, Any]],
                kills: list[float], victims: random.Random) -> None:
    """SIGKILL one worker, the next of ``victims``, if ``kill_due``, every worker trains
    (the launcher has restarted the last one killed) and ``max_kills`` allows another."""
    if config.max_kills and len(kills) >= config.max_kills:
        return
    training = _training_workers(run_dir)
    if len(training) < config.workers or not kill_due(config, commits, kills, time.time()):
        return
    pid = training[victims.randrange(config.workers)]
    with contextlib.suppress(ProcessLookupError):  # only that process: a crash
        os.kill(pid, signal.SIGKILL)
    with Journal(run_dir / "kills.jsonl") as log:  # for a look at the run afterwards
        kills.append(float(log.write("kill", target=pid)["time"]))


def _training_workers(run_dir: Path) -> dict[int, int]:
    """Launch rank -> pid of the live workers that train."""
    found = {}
    for record in read_journal(run_dir / "workers.jsonl"):
        if _ours(int(record["pid"])):
            found[int(record["launch_rank"])] = int(record["pid"])
    return found


def _reap(job: Processes, run_dir: Path) -> list[int]:
    """Stop the launcher (it stops its workers) and anything left in its group, then any
    worker it left behind."""
    job.stop(15, terminate=True)
    pids = [int(r["pid"]) for r in read_journal(run_dir / "started.jsonl")]
    for pid in pids:
        if _ours(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(_ours(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(_POLL)
    return pids


def _commit_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every worker's commit log, one list (``faults_figures`` counts each step once)."""
    return read_journal(sorted(run_dir.glob("commits-*.jsonl")))


def _ours(pid: int) -> bool:
    """A live process of the bench's job (not a zombie, not a reused pid)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "zombie" not in status and _JOB in _cmdline(pid)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"
