"""``potluck bench chaos --faults store-host``: the store's host killed mid-run.

A trial starts ``NODES`` agents on this machine (``potluck run --elastic --nnodes 3``,
one worker each, ``potluck_lab.store_host_job``), as three hosts on loopback. Node 0's
agent hosts the job's store. Once node 0's worker has committed the step drawn from the
trial's seed, node 0 is killed outright: its agent, the store and its worker (SIGKILL
to its process group). The store moves to node 1 (``potluck.succession``). A trial
passes when:

- the other nodes' agents exit 0, their workers having finished;
- every sample of every epoch was committed exactly once (the workers' ledgers);
- the survivors' final parameters are identical and equal one process training on the
  same global batches (float64, ``rtol=1e-9``);
- no process of the trial is left behind.

Recovery, per survivor: from the step it saw fail to its next committed step, and from
the kill to that commit (the step in flight at the kill may still commit before).
"""

from __future__ import annotations

import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from potluck.testing import exactly_once_problems, free_port
from potluck_lab.bench.trial_checks import TrialChecks
from potluck_lab.store_host_job import (
    SAMPLES,
    Trace,
    read_traces,
    recovery_s,
    single_process,
    trained,
)

NODES = 3
EPOCHS = 6
STEPS = EPOCHS * SAMPLES // 12
RTOL, ATOL = 1e-9, 1e-12


@dataclass(frozen=True)
class StoreHostPlan:
    """When node 0 dies in one trial, drawn from its seed."""

    seed: int
    at: int  # node 0's worker's committed steps when it is killed

    @classmethod
    def from_seed(cls, seed: int) -> StoreHostPlan:
        return cls(seed=seed, at=random.Random(seed).randint(4, STEPS - 12))

    def describe(self) -> str:
        return f"node 0 (the store's host) killed at step {self.at}"


@dataclass
class StoreHostResult(TrialChecks):
    plan: StoreHostPlan
    from_kill_s: list[float] = field(default_factory=list)  # kill -> the commit after
    from_failure_s: list[float] = field(default_factory=list)  # failed step -> commit

    def line(self) -> str:
        def seconds(values: list[float]) -> str:
            return "/".join(f"{v:.2f}" for v in values) or "-"

        return (f"seed {self.plan.seed}: {self.plan.describe()} | "
                f"completed {_yes(self.completed)} | exactly-once {_yes(self.exactly_once)} | "
                f"max |param diff| {self.max_param_diff:.1e} | "
                f"replicas equal {_yes(self.replicas_equal)} | recovery from the kill "
                f"{seconds(self.from_kill_s)} s, from the failed step "
                f"{seconds(self.from_failure_s)} s | leftover processes "
                f"{len(self.leftover)} | {self.seconds:.1f} s | "
                f"{'PASS' if self.passed else 'FAIL'}")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        return out


def run_trial(seed: int, workdir: Path, timeout: float = 150.0) -> StoreHostResult:
    """One trial in ``workdir`` (logs, traces); never raises for a failed run."""
    plan, started = StoreHostPlan.from_seed(seed), time.monotonic()
    trial = StoreHostResult(plan)
    trace = workdir / "trace"
    trace.mkdir(parents=True, exist_ok=True)
    nodes = _start(workdir, trace, free_port(), seed)
    killed_at = None
    try:
        killed_at = _kill_node_0_at(nodes, trace, plan.at, started + timeout)
        for n, node in enumerate(nodes[1:], start=1):
            left = max(1.0, started + timeout - time.monotonic())
            if node.wait(timeout=left) != 0:
                trial.problems.append(f"node {n} exited {node.returncode}: "
                                      + _tail(workdir / f"node{n}.log"))
    except (subprocess.TimeoutExpired, TimeoutError) as exc:
        trial.problems.append(f"timed out: {exc}")
    finally:
        trial.leftover = _reap(nodes)
    if not trial.problems and killed_at is not None:
        _check(trial, read_traces(trace), trace, killed_at)
    trial.seconds = time.monotonic() - started
    return trial


def _start(workdir: Path, trace: Path, port: int, seed: int) -> list[subprocess.Popen[bytes]]:
    nodes = []
    for n in range(NODES):
        argv = [sys.executable, "-m", "potluck", "run", "--elastic", "--nnodes", str(NODES),
                "--node-rank", str(n), "--nproc-per-node", "1", "--master-port", str(port),
                "--token", "chaos-store-host", "--run-id", f"store-host-{seed}",
                "-m", "potluck_lab.store_host_job", "--trace", str(trace),
                "--epochs", str(EPOCHS), "--checkpoint-dir", str(workdir / f"checkpoints{n}")]
        with (workdir / f"node{n}.log").open("wb") as sink:
            nodes.append(subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT,
                                          start_new_session=True))
    return nodes


def _kill_node_0_at(nodes: list[subprocess.Popen[bytes]], trace: Path, at: int,
                    deadline: float) -> float:
    """Kill node 0's process group once its worker committed ``at`` steps; when."""
    while not any(t.node == 0 and t.last_step >= at for t in read_traces(trace)):
        for n, node in enumerate(nodes):
            if node.poll() is not None:
                raise TimeoutError(f"node {n} ended before step {at} (exit "
                                   f"{node.returncode})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"node 0 did not reach step {at}")
        time.sleep(0.02)
    killed_at = time.time()
    os.killpg(nodes[0].pid, signal.SIGKILL)
    nodes[0].wait()
    return killed_at


def _check(trial: StoreHostResult, traces: list[Trace], trace: Path,
           killed_at: float) -> None:
    survivors = [t for t in traces if t.node != 0]
    trial.completed = (len(survivors) == NODES - 1
                       and all(t.last_step == STEPS and t.params for t in survivors))
    trial.problems += (problems := exactly_once_problems(trained(trace), SAMPLES, EPOCHS))
    trial.exactly_once = not problems
    if not trial.completed:
        trial.problems.append("a survivor did not finish: "
                              f"{[(t.node, t.last_step) for t in survivors]}")
        return
    params = [torch.load(t.params) for t in survivors if t.params is not None]
    expected = single_process(EPOCHS)
    trial.replicas_equal = all(torch.equal(p[k], params[0][k]) for p in params for k in p)
    trial.max_param_diff = max(float((p[k] - expected[k]).abs().max())
                               for p in params for k in expected)
    for name, value in expected.items():
        if not all(torch.allclose(p[name], value, rtol=RTOL, atol=ATOL) for p in params):
            trial.problems.append(f"{name} differs from one process")
    for t in survivors:
        recovered = recovery_s(t)
        if recovered is None or not t.failures:
            trial.problems.append(f"node {t.node} never saw a step fail and recover")
            continue
        trial.from_failure_s.append(round(recovered, 3))
        resumed = t.failures[0][1] + recovered  # (the step in flight may commit first)
        trial.from_kill_s.append(round(resumed - killed_at, 3))


def _reap(nodes: list[subprocess.Popen[bytes]], grace: float = 5.0) -> list[int]:
    """The nodes whose process group still had a process ``grace`` seconds after the
    run (each is killed); every node is reaped."""
    end, left = time.monotonic() + grace, []
    for node in nodes:
        while _group_alive(node.pid) and time.monotonic() < end:
            node.poll()
            time.sleep(0.1)
        if _group_alive(node.pid):
            left.append(node.pid)
            os.killpg(node.pid, signal.SIGKILL)
        node.wait()
    return left


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _tail(log: Path, lines: int = 12) -> str:
    return " / ".join(log.read_text(errors="replace").splitlines()[-lines:])


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def summary(trials: Sequence[object]) -> list[str]:
    """The recovery times over the store-host trials among ``trials`` (none: [])."""
    ours = [t for t in trials if isinstance(t, StoreHostResult)]
    if not ours:
        return []
    lines = []
    for what, values in (("the kill", [v for t in ours for v in t.from_kill_s]),
                         ("the failed step", [v for t in ours for v in t.from_failure_s])):
        seen = sorted(v for v in values if not math.isnan(v))
        if seen:
            lines.append(f"recovery from {what} to the next committed step: median "
                         f"{statistics.median(seen):.2f} s, max {seen[-1]:.2f} s "
                         f"({len(seen)} survivors)")
    return lines


def header() -> str:
    return (f"{NODES} nodes on loopback (potluck run --elastic, one worker each), the "
            f"store on node 0, killed at a random step; {EPOCHS} epochs of "
            f"{SAMPLES // 12} steps")
