"""The runs of ``potluck bench plan``: N workers of ``plan_job`` (or of
``plan_ring_job``, plain all-reduces) on N hosts of a switch, each host's link capped
(or not), each worker under a CPU quota of its own.

A worker imports torch at full speed, says it is ready, and is moved into its quota's
group (from out here: ``ip netns exec`` remounts ``/sys``) before it is told to go.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from potluck_lab.common import BenchError
from potluck_lab.jobs import Processes
from potluck_lab.machine.cpu_quota import CpuQuota, join
from potluck_lab.machine.netns import BridgedHosts

SHARES = 16384  # the CPU weight of a worker's group: 16 ordinary processes'
READY_S = 300.0
RUN_S = 600.0


@dataclass(frozen=True)
class Spec:
    """One run: rank r on host r, under ``quotas[r]`` of a core, its link at
    ``rates[r]`` (None: uncapped)."""

    mode: str  # "step" or "diloco"
    quotas: list[float]
    rates: list[str | None]
    periods: int
    global_batch: int
    inner_steps: int


class Runs:
    def __init__(self, hosts: BridgedHosts, logs: Path, prefix: str) -> None:
        self.hosts, self.logs = hosts, logs
        self.quotas = [CpuQuota(f"{prefix}-{i}", shares=SHARES)
                       for i in range(len(hosts.names))]
        self.port = 29700 + random.randrange(2000)
        self.count = 0
        self.last_rounds: list[list[list[float]]] = []

    def __enter__(self) -> Self:
        made = []
        try:
            for quota in self.quotas:
                made.append(quota.create(None))
        except BaseException:
            for quota in made:
                quota.remove()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        for quota in self.quotas:
            quota.remove()

    def run(self, spec: Spec) -> list[list[float]]:
        """The commits (time, samples) rank 0 saw. In rounds, ``last_rounds`` holds each
        rank's rounds (compute, wait, sync seconds) afterwards."""
        def argv(here: Path) -> list[str]:
            return ["-m", "potluck_lab.bench.plan_job", "--mode", spec.mode, "--periods",
                    str(spec.periods), "--inner-steps", str(spec.inner_steps),
                    "--global-batch", str(spec.global_batch)]

        out = self._launch(spec.quotas, spec.rates, argv, f"{spec.mode}")
        commits: list[list[float]] = json.loads(out)["commits"]
        here = self.logs / f"run-{self.count}"
        self.last_rounds = [json.loads(path.read_text()) for rank in range(len(spec.quotas))
                            if (path := here / f"rounds-{rank}.json").exists()]
        return commits

    def ring(self, quotas: list[float], rates: list[str | None],
             sizes: list[int]) -> dict[int, tuple[float, float]]:
        """Per size in bytes: a plain all-reduce's median wall and CPU seconds."""
        out = self._launch(quotas, rates, lambda here: [
            "-m", "potluck_lab.bench.plan_ring_job", "--sizes", ",".join(map(str, sizes))],
            "all-reduce")
        return {int(k): (v[0], v[1]) for k, v in json.loads(out).items()}

    def _launch(self, quotas: list[float], rates: list[str | None],
                argv: Callable[[Path], list[str]], what: str) -> str:
        """Rank r of ``argv`` on host r under ``quotas[r]``; rank 0's ``--out`` text."""
        self.count += 1
        self.port += 1
        here = self.logs / f"run-{self.count}"
        here.mkdir(parents=True, exist_ok=True)
        n = len(quotas)
        for host, rate in enumerate(rates):
            self.hosts.limit(rate, [host])
        go, out = here / "go", here / "out.json"
        workers = Processes()
        try:
            for rank in range(n):
                env = {**os.environ, "MASTER_ADDR": self.hosts.addresses[0],
                       "MASTER_PORT": str(self.port), "RANK": str(rank),
                       "LOCAL_RANK": "0", "WORLD_SIZE": str(n),
                       "GLOO_SOCKET_IFNAME": self.hosts.devices[rank], "OMP_NUM_THREADS": "1"}
                command = [sys.executable, *argv(here), "--ready", str(here / f"ready-{rank}"),
                           "--go", str(go), "--out", str(out)]
                workers.start(self.hosts.command(rank, command), here / f"rank{rank}.log",
                              env=env, session=False)
            self._wait_ready(here, n, workers)
            for rank, proc in enumerate(workers.procs):
                self.quotas[rank].set(quotas[rank])
                join(self.quotas[rank].path, proc.pid)
            go.touch()
            workers.wait(timeout=RUN_S)
        finally:
            workers.stop()
        if any(p.returncode for p in workers.procs) or not out.exists():
            raise BenchError(f"a worker of run {self.count} ({what}, {n} workers) "
                             f"failed; its output is in {here}:\n"
                             + (here / "rank0.log").read_text()[-2000:])
        return out.read_text()

    def _wait_ready(self, here: Path, n: int, workers: Processes) -> None:
        deadline = time.monotonic() + READY_S
        while not all((here / f"ready-{r}").exists() for r in range(n)):
            if workers.ended() or time.monotonic() > deadline:
                raise BenchError(f"the workers in {here} did not get ready: see its logs")
            time.sleep(0.05)
