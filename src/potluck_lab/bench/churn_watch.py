"""The churn bench's nodes: start them, follow their workers' traces, kill, reap.

``Nodes`` starts each loopback node (``potluck run --elastic``, one worker) in a
session of its own (``potluck_lab.jobs.Processes``) and reads the workers' ``.times``
traces incrementally (only what was appended), so following 32 workers costs the
machine little. A node is a member once its worker committed a step. ``reap`` finds
every process whose command line names the run's trace directory, so a worker, which
its agent starts in a session of its own, is found too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from potluck_lab.jobs import Processes

_POLL = 0.1


@dataclass
class _Worker:
    """What a node's worker has committed, read from its trace."""

    pid: int
    offset: int = 0
    steps: int = 0
    first_commit: float | None = None  # wall clock


class Nodes:
    """The run's nodes by rank; ranks ``0 .. founders-1`` found the cohort."""

    def __init__(self, workdir: Path, founders: int, max_nodes: int, port: int,
                 run_id: str, job: Sequence[str]) -> None:
        self.workdir, self.founders, self._max = workdir, founders, max_nodes
        self._port, self._run_id, self._job = port, run_id, list(job)
        self._trace = workdir / "trace"
        self._trace.mkdir(parents=True, exist_ok=True)
        self._procs = Processes()
        self._agents: dict[int, int] = {}  # node rank -> index in _procs
        self._started: dict[int, float] = {}  # node rank -> wall clock
        self._workers: dict[int, _Worker] = {}
        self._killed: set[int] = set()
        self._stopping = False
        self._read_at = 0.0

    def next_rank(self) -> int:
        return len(self._agents)

    def start(self, rank: int) -> int:
        """Start node ``rank``; returns it."""
        if rank >= self._max:
            raise RuntimeError(f"node {rank} is past --nnodes {self.founders}:{self._max}")
        argv = [sys.executable, "-m", "potluck", "run", "--elastic", "--nnodes",
                f"{self.founders}:{self._max}", "--node-rank", str(rank),
                "--nproc-per-node", "1", "--master-port", str(self._port), "--token",
                "churn-bench", "--run-id", self._run_id, "--max-restarts", "0",
                "--join-timeout", "600", "--log-dir", str(self.workdir / f"logs{rank}"),
                *self._job,
                "--checkpoint-dir", str(self.workdir / f"checkpoints{rank}")]
        self._procs.start(argv, self.workdir / f"node{rank}.log")
        self._agents[rank] = len(self._procs.procs) - 1
        self._started[rank] = time.time()
        return rank

    def members(self) -> set[int]:
        """Nodes whose worker committed a step and was not killed since."""
        self._read()
        return {n for n, w in self._workers.items() if w.steps and n not in self._killed}

    def all_in(self) -> bool:
        """Every node started is a member, or was killed (no joiner is on its way)."""
        return set(self._agents) <= self.members() | self._killed

    def last_step(self) -> int:
        self._read()
        return max((w.steps for w in self._workers.values()), default=0)

    def kill(self, node: int) -> float:
        """SIGKILL node ``node``'s worker (its process group); when (wall clock)."""
        pid = self._workers[node].pid
        self._killed.add(node)
        at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        return at

    def stop_at(self, epochs: int) -> None:
        """Tell every worker to end after ``epochs`` epochs (written atomically)."""
        draft = self.workdir / "stop.draft"
        draft.write_text(str(epochs))
        draft.replace(self.workdir / "stop")
        self._stopping = True

    def all_ended(self) -> bool:
        return not any(proc.poll() is None for proc in self._procs.procs)

    def wait(self, done: Callable[[], bool], limit: float, what: str) -> None:
        """Until ``done()``; a node that ends unplanned, or ``limit`` s, raises."""
        deadline = time.monotonic() + limit
        while not done():
            if not self._stopping:
                self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {limit:g} s")
            time.sleep(_POLL)

    def bad_exits(self) -> list[str]:
        """Nodes not killed whose agent failed (the run must have ended)."""
        return [self._ended(rank, code) for rank, index in self._agents.items()
                if rank not in self._killed
                and (code := self._procs.procs[index].poll()) not in (0, None)]

    def join_times(self) -> list[float]:
        """Each node that joined: seconds from its start to its worker's first commit."""
        self._read()
        return [round(w.first_commit - self._started[n], 2)
                for n, w in sorted(self._workers.items())
                if n >= self.founders and w.first_commit is not None]

    def reap(self, grace: float = 5.0) -> list[int]:
        """Processes of the run still running ``grace`` s after the agents ended (each
        is killed); every node is stopped and reaped."""
        deadline = time.monotonic() + grace
        while not self.all_ended() and time.monotonic() < deadline:
            time.sleep(_POLL)
        self._procs.stop()  # (the agents' groups; workers have sessions of their own)
        while (left := self._running()) and time.monotonic() < deadline:
            time.sleep(_POLL)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return left

    def _check_alive(self) -> None:
        for rank, index in self._agents.items():
            code = self._procs.procs[index].poll()
            if code is not None and rank not in self._killed:
                raise RuntimeError(self._ended(rank, code))

    def _ended(self, rank: int, code: int) -> str:
        lines = (self.workdir / f"node{rank}.log").read_text(errors="replace").splitlines()
        return f"node {rank} exited {code}: " + " / ".join(lines[-12:])

    def _read(self) -> None:
        """Take in what the workers appended to their traces since the last read."""
        if time.monotonic() - self._read_at < _POLL:
            return
        self._read_at = time.monotonic()
        for path in self._trace.glob("node*.times"):
            node, pid = path.stem[4:].split("-")
            worker = self._workers.setdefault(int(node), _Worker(int(pid)))
            with path.open("rb") as f:
                f.seek(worker.offset)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1  # (whole lines only)
            worker.offset += end
            for line in chunk[:end].splitlines():
                record = json.loads(line)
                if "step" in record:
                    worker.steps = record["step"]
                    worker.first_commit = worker.first_commit or record["at"]

    def _running(self) -> list[int]:
        """Processes whose command line names the run's trace directory (its agents
        and workers: ``--trace DIR``)."""
        mark, found = b"--trace\0" + str(self._trace).encode() + b"\0", []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if mark in (entry / "cmdline").read_bytes() and \
                        (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
            except (OSError, IndexError):
                continue  # it ended while we looked
        return found
