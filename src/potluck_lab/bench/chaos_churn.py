"""``potluck bench chaos --churn``: many members on this machine, killed and joining.

A run starts ``members`` loopback nodes, each ``potluck run --elastic --nnodes
N:MAX`` with one worker of ``potluck_lab.store_host_job``. Each member is a host as in
production: its own agent (which reports its worker's death to the store), its own
store connection, its own seat. Node 0's agent hosts the store. A join is a new node
rank, the path a new machine takes. About 30% of the founders make up a churning pool
(``churn_figures``): every few seconds one of them is killed (SIGKILL to its worker)
or a new node joins in a slot that is down. The others stay for the whole run.

After ``minutes`` of churn, once the last joiners are in, the bench tells the job when
to stop (``--stop-file``: an epoch's end far enough ahead that every worker reads it
first). A run passes when:

- every node running at the stop exits 0, every killed node's agent exits;
- every sample of every epoch was committed exactly once (the workers' ledgers);
- the finishers' parameters are identical and equal one process training on the same
  global batches (float64, ``rtol=1e-9``);
- no process of the run is left behind (any process whose command line names the
  run's directory, some seconds after the agents exited).

Recovery: per loss, from the first failed step any worker saw to the next committed
step, and from the kill to that commit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from potluck.testing import exactly_once_problems, free_port
from potluck_lab.bench.churn_figures import (
    JOIN,
    ChurnEvent,
    churn_schedule,
    from_kills,
    losses,
    percentile,
    pool_nodes,
    stop_epoch,
)
from potluck_lab.bench.churn_watch import Nodes
from potluck_lab.bench.trial_checks import TrialChecks
from potluck_lab.store_host_job import read_traces, single_process, trained

RTOL, ATOL = 1e-9, 1e-12


@dataclass(frozen=True)
class ChurnJob:
    """The job's sizes (a tiny float64 model) and the run's bounds."""

    samples: int = 960
    global_batch: int = 96  # 96 / 32 = 3 samples a member; any world size divides it
    step_time: float = 0.05  # a stand-in for compute
    collective_timeout: float = 20.0
    fraction: float = 0.3  # of the founders churn
    gap: tuple[float, float] = (2.0, 6.0)  # seconds between churn events

    @property
    def steps_per_epoch(self) -> int:
        return self.samples // self.global_batch

    def start_limit(self, members: int) -> float:
        """Seconds for the founders to start and commit a first step (imports on 2
        cores: about 4 s of CPU each)."""
        return 60.0 + 10.0 * members


@dataclass
class ChurnResult(TrialChecks):
    members: int
    seconds_planned: float
    seed: int
    kills: list[float] = field(default_factory=list)  # when (wall clock)
    joins: list[float] = field(default_factory=list)  # a joiner's start -> first commit
    churned: int = 0  # distinct members killed
    world: tuple[int, int] = (0, 0)  # the fewest and most members seen in
    epochs: int = 0
    recovery_s: list[float] = field(default_factory=list)  # per loss: detected -> commit
    from_kill_s: list[float] = field(default_factory=list)  # per kill: kill -> commit

    def figures(self) -> dict[str, float]:
        return {"recovery_median_s": percentile(self.recovery_s, 50),
                "recovery_p95_s": percentile(self.recovery_s, 95),
                "from_kill_median_s": percentile(self.from_kill_s, 50),
                "from_kill_p95_s": percentile(self.from_kill_s, 95),
                "join_median_s": percentile(self.joins, 50)}

    def line(self) -> str:
        f = self.figures()
        return (f"members {self.members}: {len(self.kills)} kills, {len(self.joins)} joins "
                f"({self.churned} of {self.members} founders churned), world "
                f"{self.world[0]}-{self.world[1]}, {self.epochs} epochs | exactly-once "
                f"{_yes(self.exactly_once)} | replicas equal {_yes(self.replicas_equal)} "
                f"(max |param diff| {self.max_param_diff:.1e}) | recovery after a loss: "
                f"median {f['recovery_median_s']:.2f} s, p95 {f['recovery_p95_s']:.2f} s "
                f"({len(self.recovery_s)} losses; from the kill: median "
                f"{f['from_kill_median_s']:.2f} s, p95 {f['from_kill_p95_s']:.2f} s) | join "
                f"to first step: median {f['join_median_s']:.1f} s | leftover processes "
                f"{len(self.leftover)} | {self.seconds:.0f} s | "
                f"{'PASS' if self.passed else 'FAIL'}")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(self.figures(), passed=self.passed)
        return out


def run_churn(members: int, seconds: float, seed: int, workdir: Path,
              job: ChurnJob = ChurnJob()) -> ChurnResult:
    """One churn run in ``workdir`` (logs, traces); never raises for a failed run."""
    started = time.monotonic()
    result = ChurnResult(members, seconds, seed)
    workdir.mkdir(parents=True, exist_ok=True)
    nodes = Nodes(workdir, members, _max_nodes(members, seconds, job), free_port(),
                  f"churn-{members}-{seed}", _job_args(job, workdir))
    try:
        for rank in range(members):
            nodes.start(rank)
        _drive(nodes, result, churn_schedule(seed, members, seconds, fraction=job.fraction,
                                             gap=job.gap), job)
    except (TimeoutError, RuntimeError) as exc:
        result.problems.append(str(exc))
    finally:
        result.leftover = nodes.reap()
    if not result.problems:
        _check(result, workdir / "trace", job)
    result.seconds = time.monotonic() - started
    return result


def _drive(nodes: Nodes, result: ChurnResult, events: list[ChurnEvent],
           job: ChurnJob) -> None:
    """Wait for the founders, play the events, then stop the job and wait for it."""
    limit = job.start_limit(nodes.founders)
    nodes.wait(lambda: len(nodes.members()) == nodes.founders, limit,
               f"the {nodes.founders} founders did not all commit a step")
    slots = pool_nodes(result.seed, nodes.founders, job.fraction)
    t0, killed = time.monotonic(), set()
    low = high = nodes.founders
    for event in events:
        nodes.wait(_after(t0 + event.at), math.inf, "")
        if event.kind == JOIN:
            slots[event.slot] = nodes.start(nodes.next_rank())
            continue
        node = slots[event.slot]  # a joiner is killed once it is in (committed a step)
        nodes.wait(partial(_is_member, nodes, node), limit,
                   f"node {node} (a joiner) was not admitted")
        result.kills.append(nodes.kill(node))
        killed.add(node)
        live = len(nodes.members())
        low, high = min(low, live), max(high, live + 1)
    nodes.wait(_after(t0 + result.seconds_planned), math.inf, "")
    # (a node that arrived after the job's end would find no store to join)
    nodes.wait(nodes.all_in, limit, "the last joiners were not admitted")
    epochs = stop_epoch(nodes.last_step(), job.steps_per_epoch)
    nodes.stop_at(epochs)
    result.epochs, result.world = epochs, (low, high)
    result.churned = len(killed & set(range(nodes.founders)))
    result.joins = nodes.join_times()
    nodes.wait(nodes.all_ended, limit + 30.0 * epochs, "the job did not finish")
    result.problems += nodes.bad_exits()


def _after(moment: float) -> Callable[[], bool]:
    return lambda: time.monotonic() >= moment


def _is_member(nodes: Nodes, node: int) -> bool:
    return node in nodes.members()


def _check(result: ChurnResult, trace: Path, job: ChurnJob) -> None:
    traces = read_traces(trace)
    done = [t for t in traces if t.params is not None]
    last = result.epochs * job.steps_per_epoch
    result.completed = bool(done) and all(t.last_step == last for t in done)
    problems = exactly_once_problems(trained(trace), job.samples, result.epochs)
    result.exactly_once = not problems
    result.problems += problems
    if not result.completed:
        result.problems.append(f"the finishers' last steps {[t.last_step for t in done]}, "
                               f"not {last}")
        return
    params = [torch.load(t.params) for t in done if t.params is not None]
    expected = single_process(result.epochs, job.samples, job.global_batch)
    result.replicas_equal = all(torch.equal(p[k], params[0][k]) for p in params for k in p)
    result.max_param_diff = max(float((p[k] - expected[k]).abs().max())
                                for p in params for k in expected)
    for name, value in expected.items():
        if not all(torch.allclose(p[name], value, rtol=RTOL, atol=ATOL) for p in params):
            result.problems.append(f"{name} differs from one process")
    found = losses([at for t in traces for _, at in t.failures],
                   [at for t in traces for _, at in t.commits])
    result.recovery_s = [round(loss.seconds, 3) for loss in found]
    result.from_kill_s = [round(s, 3) for s in from_kills(result.kills, found)]


def _max_nodes(members: int, seconds: float, job: ChurnJob) -> int:
    """Node ranks for the founders and every join the run could make."""
    return members + math.ceil(seconds / job.gap[0]) + 1


def _job_args(job: ChurnJob, workdir: Path) -> list[str]:
    return ["-m", "potluck_lab.store_host_job", "--trace", str(workdir / "trace"),
            "--epochs", "1000000", "--samples", str(job.samples), "--global-batch",
            str(job.global_batch), "--step-time", str(job.step_time), "--timeout",
            str(job.collective_timeout), "--stop-file", str(workdir / "stop")]


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def header(members: list[int], seconds: float, seed: int, job: ChurnJob = ChurnJob()) -> str:
    return (f"potluck bench chaos --churn: {', '.join(map(str, members))} members, "
            f"{seconds / 60:g} min of churn each from seed {seed}; loopback nodes (potluck "
            f"run --elastic, one worker each), {job.fraction:.0%} of the founders churning, "
            f"an event every {job.gap[0]:g}-{job.gap[1]:g} s; {job.samples} samples, "
            f"global batch {job.global_batch}")


def summary(runs: list[ChurnResult]) -> list[str]:
    """The recovery figures against the member count, one line per count."""
    lines = ["members  kills  joins  losses  recovery median  recovery p95  passed"]
    for run in runs:
        f = run.figures()
        lines.append(f"{run.members:>7}  {len(run.kills):>5}  {len(run.joins):>5}  "
                     f"{len(run.recovery_s):>6}  {f['recovery_median_s']:>13.2f} s  "
                     f"{f['recovery_p95_s']:>10.2f} s  {_yes(run.passed):>6}")
    lines.append(f"{sum(r.passed for r in runs)}/{len(runs)} runs passed")
    return lines


def payload(runs: list[ChurnResult], seconds: float, seed: int,
            job: ChurnJob = ChurnJob()) -> dict[str, Any]:
    """The figures at the top level, keyed by member count; each run in full."""
    figures = {name: {str(r.members): r.figures()[name] for r in runs}
               for name in ("recovery_median_s", "recovery_p95_s", "from_kill_median_s",
                            "from_kill_p95_s", "join_median_s")}
    return {"members": [r.members for r in runs], "minutes": seconds / 60, "seed": seed,
            "passed": sum(r.passed for r in runs), **figures, "job": asdict(job),
            "runs": [r.as_dict() for r in runs]}
