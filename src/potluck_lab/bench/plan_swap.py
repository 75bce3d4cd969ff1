"""``potluck bench plan --swap``: a member's link throttled mid-run, and a spare waiting.

Four hosts on a switch, every link capped at ``rate`` both ways. Each starts
``potluck run --elastic --nnodes 3:4 --cohort-size 3 --swap-drag D --swap-window W``
(``plan_swap_job``) at once: the first three workers to join found the cohort, and the
fourth waits as a spare (the founders train once all four started). Once the spare
waits and ``throttle_at`` steps committed, the link of a member other than node 0 (the
store's host) drops to ``slow_rate`` (a ``tc tbf`` change in its namespace). The
cohort should swap that member for the spare within the window. With ``slow_rate``
None (``--no-throttle``), nobody is throttled: the control, which should swap nobody.

Figures (``swap_figures``, pure): the steps from the throttle to the swap, the
throughput after it over the healthy cohort's (the step intervals), and whether
every sample was trained exactly once (the workers' ledgers). The members' compute a
step in each phase (``compute_figures``, from the ``rank_step`` journals) is CPU work
only: where it stretches, other jobs on the host held the workers back.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from potluck.testing import exactly_once_problems
from potluck_lab.common import BenchError
from potluck_lab.machine.netns import BridgedHosts

NODES = 4


def swap_header(throttle: bool) -> str:
    what = ("one member's link throttled to 8mbit mid-run" if throttle
            else "no link throttled (the control)")
    return (f"potluck bench plan --swap: 3 members and a spare on 80mbit links, {what}; "
            "--swap-drag 0.3 --swap-window 12")


@dataclass(frozen=True)
class SwapConfig:
    rate: str = "80mbit"
    slow_rate: str | None = "8mbit"  # (None: no throttle, a healthy run)
    steps: int = 150
    throttle_at: int = 30
    drag: float = 0.3
    window: int = 12
    global_batch: int = 96
    limit_s: float = 240.0


@dataclass(frozen=True)
class Commit:
    node: int
    step: int
    at: float
    world: int


def read_commits(trace: Path) -> list[Commit]:
    """Every worker's committed steps, in time order."""
    commits = []
    for path in trace.glob("node*.times"):
        node = int(path.stem.split("-")[0][4:])
        for line in path.read_text().splitlines():
            record = json.loads(line)
            commits.append(Commit(node, record["step"], record["at"], record["world"]))
    return sorted(commits, key=lambda c: c.at)


def swap_figures(commits: list[Commit], victim_node: int, throttled_after: int,
                 global_batch: int, settle: int = 5) -> dict[str, Any]:
    """From the commits: the swap's step (the victim's last), its distance from the
    throttle, and the cohort's throughput (each step's first commit) healthy (before
    the throttle), throttled and after the swap (``settle`` steps after it on)."""
    victim = [c.step for c in commits if c.node == victim_node]
    swapped = max(victim) if victim and max(victim) < max(c.step for c in commits) \
        else None
    first: dict[int, float] = {}  # each step's first commit, whoever made it
    for c in commits:
        first[c.step] = min(c.at, first.get(c.step, c.at))
    lead = sorted(first.items())
    gaps = {step: at - before for (_, before), (step, at) in itertools.pairwise(lead)}

    def rate(low: int, high: int) -> float | None:
        chosen = [g for s, g in gaps.items() if low <= s <= high]
        return global_batch / statistics.median(chosen) if chosen else None

    end = max(gaps, default=0)
    healthy = rate(max(2, throttled_after // 3), throttled_after)
    after = rate(swapped + settle, end) if swapped is not None else None
    return {
        "swap_step": swapped,
        "swap_after_steps": None if swapped is None else swapped - throttled_after,
        "healthy_samples_per_s": healthy,
        "throttled_samples_per_s": rate(throttled_after + 2, swapped or end),
        "after_samples_per_s": after,
        "throughput_ratio_after_vs_healthy":
            after / healthy if after is not None and healthy else None,
    }


def run_swap(config: SwapConfig, logs: Path) -> dict[str, Any]:
    """One run on fresh hosts; the figures, the swap's note and the exactly-once check."""
    trace, metrics = logs / "trace", logs / "metrics"
    trace.mkdir(parents=True)
    with BridgedHosts(NODES, prefix="pl-swap") as hosts:
        hosts.limit(config.rate)
        agents: list[subprocess.Popen[bytes]] = []
        try:
            port = 29000 + random.randrange(2000)
            agents = [_start(hosts, node, port, config, logs, trace, metrics)
                      for node in range(NODES)]
            _wait(lambda: (trace / "spare.queued").exists(), agents, config.limit_s)
            at = max(config.throttle_at, _steps(trace) + 10)
            if at > config.steps // 2:
                raise BenchError(f"the workers took until step {at - 10} of "
                                 f"{config.steps} to start; a healthy phase needs more steps")
            _wait(lambda: _steps(trace) >= at, agents, config.limit_s)
            members = sorted({c.node for c in read_commits(trace)})
            victim = next(n for n in members if n != 0)
            if config.slow_rate is not None:
                hosts.limit(config.slow_rate, [victim])
            # (the last step committed once the throttle holds: the steps after it drag)
            throttled_after = _steps(trace)
            deadline = time.monotonic() + config.limit_s
            codes = [a.wait(timeout=max(1.0, deadline - time.monotonic())) for a in agents]
        except subprocess.TimeoutExpired:
            raise BenchError(f"the swap run did not end within {config.limit_s:g} s; "
                             f"the agents' output is in {logs}") from None
        finally:
            for agent in agents:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    figures = swap_figures(read_commits(trace), victim, throttled_after, config.global_batch)
    figures.update(compute_figures(_journal(metrics), throttled_after, figures["swap_step"]))
    problems = exactly_once_problems(trace, config.steps * config.global_batch)
    notes = _swap_notes(metrics)
    return {**figures, "throttled_after": throttled_after, "exit_codes": codes,
            "exactly_once": not problems, "exactly_once_problems": problems[:3],
            "swap_note": next(iter(notes), None), "swaps": len(notes),
            "throttled": config.slow_rate is not None, "window": config.window,
            "drag": config.drag, "victim_node": victim}


def _start(hosts: BridgedHosts, node: int, port: int, config: SwapConfig, logs: Path,
           trace: Path, metrics: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "potluck", "run", "--elastic", "--nnodes", "3:4",
            "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr",
            hosts.addresses[0], "--master-port", str(port), "--token", "swap-bench",
            "--run-id", "swap", "--cohort-size", "3", "--swap-drag", f"{config.drag:g}",
            "--swap-window", str(config.window), "--metrics-dir", str(metrics),
            "-m", "potluck_lab.bench.plan_swap_job", "--trace", str(trace),
            "--steps", str(config.steps), "--global-batch", str(config.global_batch),
            "--hellos", str(NODES)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with (logs / f"node{node}.log").open("wb") as sink:
        return subprocess.Popen(hosts.command(node, argv), stdout=sink,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _steps(trace: Path) -> int:
    return max((c.step for c in read_commits(trace)), default=0)


def _wait(done: Any, agents: list[subprocess.Popen[bytes]], limit: float) -> None:
    deadline = time.monotonic() + limit
    while not done():
        if any(a.poll() is not None for a in agents):
            raise BenchError("an agent of the swap run ended before the cohort trained")
        if time.monotonic() > deadline:
            raise BenchError(f"the swap run did not get there within {limit:g} s")
        time.sleep(0.05)


def compute_figures(computes: list[tuple[int, float]], throttled_after: int,
                    swap_step: int | None, settle: int = 5) -> dict[str, float | None]:
    """The members' median compute a step (ms), healthy and after the swap, from
    (step, seconds) pairs: the phases of ``swap_figures``."""
    def median_ms(low: int, high: float) -> float | None:
        chosen = [s for step, s in computes if low <= step <= high]
        return 1e3 * statistics.median(chosen) if chosen else None

    return {"compute_ms_healthy": median_ms(max(2, throttled_after // 3), throttled_after),
            "compute_ms_after": None if swap_step is None
            else median_ms(swap_step + settle, float("inf"))}


def _journal(metrics: Path) -> list[tuple[int, float]]:
    """(committed step, compute seconds) of every member's steps (``rank_step``)."""
    out = []
    for path in sorted(metrics.rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == "rank_step" and record.get("compute_s") is not None:
                out.append((int(record["step"]) + 1, float(record["compute_s"])))
    return out


def _swap_notes(metrics: Path) -> list[dict[str, Any]]:
    """The swaps' ``event`` records in the ``rank_step`` journals (rank 0 notes each),
    in step order."""
    notes = []
    for path in sorted(metrics.rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("what") == "swap":
                notes.append(dict(record))
    return sorted(notes, key=lambda n: n.get("step", 0))


def swap_lines(results: dict[str, Any]) -> list[str]:
    def per_s(key: str) -> str:
        value = results.get(key)
        return "-" if value is None else f"{value:.1f} samples/s"

    def ms(key: str) -> str:
        value = results.get(key)
        return "-" if value is None else f"{value:.1f} ms"

    note = results.get("swap_note") or {}
    ratio = results.get("throughput_ratio_after_vs_healthy")
    if not results.get("throttled", True):
        return [f"no link throttled; {results['swaps']} swap(s) (a healthy cohort should "
                f"make none); exactly_once: {results['exactly_once']}",
                f"cohort {per_s('healthy_samples_per_s')} (steps to "
                f"{results['throttled_after']}), members' compute a step "
                f"{ms('compute_ms_healthy')}",
                f"event: {note.get('text', 'none noted')}"]
    return [
        f"throttled node {results['victim_node']}'s link after step {results['throttled_after']}; "
        f"swap at step {results['swap_step']} (window {results['window']}, drag "
        f"{results['drag']:g})",
        f"healthy {per_s('healthy_samples_per_s')}, throttled "
        f"{per_s('throttled_samples_per_s')}, after the swap {per_s('after_samples_per_s')}",
        f"members' compute a step (CPU only): healthy {ms('compute_ms_healthy')}, after "
        f"the swap {ms('compute_ms_after')}",
        f"swap_after_steps: {results['swap_after_steps']}; "
        f"throughput_ratio_after_vs_healthy: {'-' if ratio is None else f'{ratio:.3f}'}; "
        f"exactly_once: {results['exactly_once']}",
        f"event: {note.get('text', 'none noted')}",
    ]
