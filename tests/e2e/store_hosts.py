"""Multi-node elastic jobs on hosts in network namespaces, for the store-host tests.

``BridgedHosts`` (``potluck_lab.machine.netns``) builds the hosts on a switch; ``Job``
starts ``potluck run --elastic`` on each with ``potluck_lab.store_host_job``, its agent
the leader of a process group of its own, so a host's processes are killed together.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from potluck_lab.machine.netns import BridgedHosts, NetnsError, unavailable
from tests.e2e.helpers import ROOT

# The job's collective timeout bounds how long a worker's exit waits for the group it
# abandoned (its threads wait in receives from a lost peer until then), and the settle
# timeout how long the side that stops waits for a quorum before NoQuorumError. A lost
# peer is detected by its heartbeat (3 s) either way, so shorter ones show the same.
QUICK = ("--timeout", "10", "--settle-timeout", "10")


def bridged_hosts(count: int) -> Iterator[BridgedHosts]:
    """For a fixture: ``count`` hosts on a switch, deleted whatever happens; the test is
    skipped, with the reason, where they cannot be built (no root, no ``ip``)."""
    why = unavailable(tools=("ip",))
    if why is not None:
        pytest.skip(f"{count} hosts in network namespaces: {why}")
    hosts = BridgedHosts(count)
    try:
        hosts.open()  # (deletes what it made if it fails)
    except NetnsError as exc:
        pytest.skip(f"cannot build {count} hosts in network namespaces: {exc}")
    try:
        yield hosts
    finally:
        hosts.close()


class Job:
    """One agent a host, one worker an agent, the store on host 0; logs and traces
    under ``directory``."""

    def __init__(self, hosts: BridgedHosts, directory: Path, port: int, epochs: int) -> None:
        self.hosts, self.directory, self.epochs = hosts, directory, epochs
        self.trace = directory / "trace"
        self.trace.mkdir()
        self.logs = [directory / f"node{n}.log" for n in range(len(hosts.names))]
        self.nodes: list[subprocess.Popen[bytes]] = []
        self._port = port

    def start(self) -> None:
        count = len(self.hosts.names)
        for n, log in enumerate(self.logs):
            argv = [sys.executable, "-m", "potluck", "run", "--elastic", "--nnodes",
                    str(count), "--node-rank", str(n), "--nproc-per-node", "1",
                    "--master-addr", self.hosts.addresses[0], "--master-port",
                    str(self._port), "--join-timeout", "60", "--token", "s3cret-hosts",
                    "--run-id", "store-hosts", "-m", "potluck_lab.store_host_job",
                    "--trace", str(self.trace), "--epochs", str(self.epochs), *QUICK,
                    "--checkpoint-dir", str(self.directory / f"checkpoints{n}")]
            env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
            with log.open("wb") as sink:
                self.nodes.append(subprocess.Popen(
                    self.hosts.command(n, argv), stdout=sink, stderr=subprocess.STDOUT,
                    cwd=ROOT, env=env, start_new_session=True))

    def text(self, node: int) -> str:
        return self.logs[node].read_text()

    def wait_for(self, done: Callable[[], bool], limit: float = 120.0) -> None:
        """Until ``done()``; every agent must live meanwhile."""
        deadline = time.monotonic() + limit
        while not done():
            for n, node in enumerate(self.nodes):
                assert node.poll() is None, f"node {n} ended early:\n{self.text(n)[-3000:]}"
            assert time.monotonic() < deadline, f"not done in {limit:g} s"
            time.sleep(0.1)

    def kill(self, node: int) -> None:
        """Node ``node``'s agent, its store and its worker, at once."""
        os.killpg(self.nodes[node].pid, signal.SIGKILL)
        self.nodes[node].wait()

    def wait(self, node: int, limit: float) -> int:
        return self.nodes[node].wait(timeout=limit)

    def close(self) -> None:
        """Kill every process group still there (``ip netns exec`` execs the agent)."""
        for node in self.nodes:
            with contextlib.suppress(ProcessLookupError):  # (none left in the group)
                os.killpg(node.pid, signal.SIGKILL)
            node.wait()
