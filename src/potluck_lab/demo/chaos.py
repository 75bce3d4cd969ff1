"""``potluck demo --chaos``: the demo's transformer trained elastically, a worker killed mid-run.

The workers are started by the launcher's agent, in this process, exactly as

    potluck run --elastic --max-restarts 1 --token <random> --nproc-per-node W \\
        -m potluck_lab.demo.elastic_worker ...

would start them: the agent hosts the store, restarts a dead worker alone, and on
Ctrl-C or a failure stops and reaps every worker. Their output goes to
``<run dir>/workers.log``. A driver thread follows the records the workers append to
the run dir and prints what happens as it happens. The victim (launch rank 1: never the
last one alive) stops once a third of the steps have committed and says so; the driver
then SIGKILLs it, so the kill lands at a known step, with the others inside the next
one. If the restarted worker has not asked to join by two thirds of the way, the
survivors wait for it there: the run always shows the rejoin. The closing report is
built from the same records by the pure functions of ``chaos_report``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from potluck.errors import ConfigError
from potluck.launch.config import LaunchConfig
from potluck.metrics.journal import Journal, JournalFollower
from potluck_lab.demo.chaos_report import (
    ChaosRun,
    Incarnation,
    events_table,
    figures,
    format_event,
    format_join,
    format_kill,
    format_redo,
    format_step,
    format_wait,
    loss_milestones,
    parse_run,
    steps_line,
    throughput_rows,
)
from potluck_lab.demo.launched import LaunchedConfig, ended_badly, model_line, run_workers
from potluck_lab.demo.presets import (
    CHAOS_FULL,
    CHAOS_QUICK,
    check_seed,
    check_several_workers,
    refuse_resume,
    sized,
    worker_argv,
)
from potluck_lab.demo.report import sample_block

WORKER_MODULE = "potluck_lab.demo.elastic_worker"
VICTIM = 1  # launch rank 1; cohort ranks follow join order, so it may be the cohort's rank 0
REJOIN_TIMEOUT_S = 60.0  # the longest the survivors wait for the restarted worker
# Not the plain demo's runs/demo/: a chaos run must never overwrite its results.
CHAOS_METRICS = Path("runs/demo-chaos/metrics.jsonl")


@dataclass(frozen=True)
class ChaosConfig(LaunchedConfig):
    kill_at: int  # the victim stops once this many steps have committed, and is killed
    rejoin_by: int  # a cohort still short of the restarted worker waits for it here
    run_dir: Path


def config_from_args(args: argparse.Namespace) -> ChaosConfig:
    """Validate the demo's flags for a chaos run; ConfigError names value, rule and fix."""
    preset = sized(args, CHAOS_FULL, CHAOS_QUICK)
    steps, batch, workers = preset.steps, preset.global_batch, args.workers
    check_several_workers("chaos", workers, "the chaos demo kills a worker and the others "
                                            "must train on without it")
    if steps < 3:
        raise ConfigError(
            f"--chaos with --steps {steps}: the kill comes a third of the way through and "
            f"the run must go on after it, so it needs at least 3 steps; use e.g. --steps "
            f"{(CHAOS_QUICK if args.quick else CHAOS_FULL).steps}"
        )
    if batch < workers or batch % workers or batch % (workers - 1):
        fits = workers * (workers - 1) * max(1, batch // (workers * (workers - 1)))
        raise ConfigError(
            f"--chaos with global batch {batch} (--batch-size) and --workers {workers}: the "
            f"batch is split evenly over {workers} workers, and over the {workers - 1} left "
            f"after the kill, so it must be a multiple of both; use e.g. --batch-size {fits}"
        )
    check_seed(args.seed)
    refuse_resume(args.resume, "chaos", " (a restarted worker receives the live state from "
                                        "the others)")
    kill_at = max(1, steps // 3)
    metrics = CHAOS_METRICS if args.metrics is None else args.metrics
    return ChaosConfig(
        workers=workers, seed=args.seed, preset=preset,
        kill_at=kill_at, rejoin_by=max(kill_at, min(2 * steps // 3, steps - 2)),
        # A directory of its own: the driver reads every *.jsonl there as the run's records.
        run_dir=metrics.parent / "records",
        metrics=metrics, progress=not args.no_progress,
    )


def launch_config(config: ChaosConfig, token: str) -> LaunchConfig:
    """What ``potluck run --elastic --max-restarts 1 --token T -m <worker>`` would build."""
    worker_args = (
        "--run-dir", str(config.run_dir), *worker_argv(config.preset, config.seed),
        "--sample-chars", str(config.preset.sample_chars), "--victim", str(VICTIM),
        "--kill-at", str(config.kill_at), "--rejoin-by", str(config.rejoin_by),
        "--rejoin-timeout", f"{REJOIN_TIMEOUT_S:g}",
    )
    return LaunchConfig(script=WORKER_MODULE, script_args=worker_args, module=True,
                        nproc_per_node=config.workers, max_restarts=1, elastic=True,
                        token=token, run_id=f"demo-chaos-{secrets.token_hex(4)}",
                        grace_period=3.0)


class ChaosDriver:
    """A thread that follows the run, prints it live, and kills the victim once it stopped."""

    def __init__(self, config: ChaosConfig, out: Callable[[str], None]) -> None:
        self.config, self.out = config, out
        self.records: list[dict[str, Any]] = []
        self._follower = JournalFollower(config.run_dir)
        self._journal = Journal(config.run_dir / "driver.jsonl")
        self._shown: set[tuple[str, int]] = set()
        self._killed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="potluck-chaos", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> ChaosRun:
        """Stop following; the run as the records tell it, read to the last line."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._journal.close()
        return parse_run(self.records)

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self._poll()
        self._poll()

    def _poll(self) -> None:
        new = self._follower.poll()
        self.records.extend(new)
        run = parse_run(self.records)
        for record in new:
            self._show(record, run)
        self._maybe_kill(run)

    def _show(self, record: dict[str, Any], run: ChaosRun) -> None:
        kind, total = record.get("kind"), self.config.preset.steps
        every = max(1, total // 15)
        if kind == "step" and self.config.progress:
            step = int(record["step"])
            if step == 0 or (step + 1) % every == 0 or step + 1 == total:
                self.out(format_step(record, total))
        elif kind == "redo" and self._first("redo", int(record["step"])):
            self.out(format_redo(int(record["step"]), int(record["workers"])))
        elif kind == "event" and self._first("event", int(record["generation"])):
            event = next(e for e in run.events if e.generation == record["generation"])
            self.out(format_event(event, run))
            for pid, incarnation in run.incarnations.items():
                if run.members.get(pid) in event.joined:
                    self._show_join(incarnation, run)
        elif kind == "hello" and int(record["restart"]) > 0:
            self.out(f"the launcher restarted worker {record['launch_rank']} as pid "
                     f"{record['pid']} (restart {record['restart']} of 1); it asks to join "
                     "the running cohort")
        elif kind == "joined" and ("event", int(record["generation"])) in self._shown:
            self._show_join(run.incarnations[int(record["pid"])], run)
        elif kind == "waited" and run.rejoin_wait is not None:
            self.out(format_wait(run.rejoin_wait, f"worker {VICTIM}"))
        elif kind == "kill" and run.kill is not None:
            victim = run.incarnations.get(run.kill.pid)
            self.out(format_kill(run.kill, victim.label if victim else f"pid {run.kill.pid}"))

    def _show_join(self, incarnation: Incarnation, run: ChaosRun) -> None:
        """Once its generation was shown, and once it said it has the state."""
        if incarnation.pid in run.joins and self._first("join", incarnation.pid):
            self.out(format_join(incarnation, run.joins[incarnation.pid]))

    def _first(self, kind: str, key: int) -> bool:
        seen = (kind, key) in self._shown
        self._shown.add((kind, key))
        return not seen

    def _maybe_kill(self, run: ChaosRun) -> None:
        """SIGKILL the victim once it has stopped after ``kill_at`` committed steps: the
        run cannot move past that point without it, so the line printed is exact."""
        if self._killed:
            return
        victim = next((inc for inc in run.incarnations.values()
                       if inc.launch_rank == VICTIM and inc.restart == 0
                       and inc.pid in run.held), None)
        if victim is None:  # not there yet: try again on the next poll
            return
        self._killed = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim.pid, signal.SIGKILL)
        self._journal.write("kill", target=victim.pid, launch_rank=victim.launch_rank,
                            after_step=run.held[victim.pid] - 1)


def main(args: argparse.Namespace) -> int:
    """Run the chaos demo: 0 on success, 1 on failure, 130 on Ctrl-C; a bad flag
    raises ``ConfigError`` (``cli.main`` exits 2)."""
    config = config_from_args(args)
    started = time.perf_counter()
    _prepare(config.run_dir)
    token = secrets.token_hex(16)  # admission secret for this run only; never printed
    launch = launch_config(config, token)
    _print_header(config, launch)
    driver = ChaosDriver(config, lambda line: print(line, flush=True))
    try:
        code, emitted = run_workers(launch, config.run_dir / "workers.log", driver)
    finally:
        run = driver.stop()
    if code < 128:
        _write_metrics(config, run)
    failed = ended_badly(code, emitted, run.final_steps, config.preset.steps, "chaos",
                         config.run_dir / "workers.log")
    if failed is not None:
        return failed
    _print_report(config, run)
    print(f"done in {time.perf_counter() - started:.1f} s; per-step metrics in "
          f"{config.metrics}; worker output in {config.run_dir / 'workers.log'}")
    return 0


def _prepare(run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in [*run_dir.glob("worker-*.jsonl"), run_dir / "driver.jsonl"]:
        old.unlink(missing_ok=True)  # records of an earlier run would be read as ours


def _print_header(config: ChaosConfig, launch: LaunchConfig) -> None:
    p = config.preset
    print(model_line("potluck demo --chaos", p, config.seed))
    print(f"{config.workers} elastic workers, global batch {p.global_batch}, {p.steps} steps, "
          f"seed {config.seed}, started as:")
    print(f"  potluck run --elastic --max-restarts {launch.max_restarts} --token <random> "
          f"--nproc-per-node {launch.nproc_per_node} -m {launch.script} "
          f"{' '.join(launch.script_args)}")
    print(f"chaos: worker {VICTIM} stops once step {config.kill_at} of {p.steps} has "
          f"committed and gets SIGKILL there, while the others are in step "
          f"{config.kill_at + 1}")
    print(f"chaos: the launcher restarts it and it rejoins with the live state; if it has "
          f"not asked to join once step {config.rejoin_by} has committed, the others wait "
          "for it there")
    print(f"results: per-step metrics to {config.metrics}, the workers' records and output "
          f"to {config.run_dir}/", flush=True)


def _write_metrics(config: ChaosConfig, run: ChaosRun) -> None:
    p = config.preset
    with Journal(config.metrics, truncate=True) as journal:
        for step in sorted(run.steps):
            record = run.steps[step]
            rate = p.global_batch / float(record["step_s"])
            journal.write("step", step=step, loss=record["loss"], step_s=record["step_s"],
                          samples_per_s=rate, tokens_per_s=rate * p.context,
                          workers=record["workers"], generation=record["generation"],
                          redone=step in run.redone, at=float(record["time"]))


def _print_report(config: ChaosConfig, run: ChaosRun) -> None:
    p = config.preset
    print()
    print(f"model: {run.n_params:,} parameters")
    print(steps_line(run, p.steps))
    print(loss_milestones(run))
    print()
    print(events_table(run))
    if run.kill is not None and not run.joins:
        print(f"note: worker {run.kill.launch_rank} was not admitted again before the run "
              f"ended: its restart did not ask to join within {REJOIN_TIMEOUT_S:g} s of step "
              f"{config.rejoin_by}; see {config.run_dir / 'workers.log'}")
    print()
    print(figures(throughput_rows(run, p.global_batch, p.context, p.warmup_steps)))
    if run.sample is not None:
        print()
        print(sample_block(run.sample, "def "))
    print()
