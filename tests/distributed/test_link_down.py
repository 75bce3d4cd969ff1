"""A worker's link goes down mid-run: the other two notice, redo the step and finish.

Three hosts, each a network namespace with its own address, plugged by a veth pair into
a bridge in the root namespace; the bridge holds the store's address (the test process
hosts the store, as the launcher's agent does). At step CUT_AT the test takes the
victim's link down at the bridge (the cable pulled at the switch): its peers hear
nothing more, neither an error nor a closed connection. They notice when its heartbeat
goes stale (the member before it in the generation watches it), well before the
collective timeout, form the next generation without it and redo the step. Checked:
the survivors finish with the parameters of one process on the same global batches
(float64, rtol 1e-9), every sample of every epoch was trained exactly once (ledger), and
the recovery event names the victim and came within its bounds. The cut-off worker
cannot reach the store either: once no heartbeat of its own got through for the
heartbeat timeout it gives up with ``RendezvousError`` instead of hanging in a store
request (see ``_await_victim``). No worker process and no namespace outlives the test.
Needs root and iproute2 (`ip netns`); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from potluck.testing import assert_exactly_once, free_port
from potluck_lab.elastic_job import (
    ElasticJob,
    leftover_processes,
    single_process,
)

ROOT = Path(__file__).resolve().parents[2]
CUT_AT = 4  # the victim's link goes down before this step's collectives
VICTIM = 2
COLLECTIVE_TIMEOUT = 8.0  # far above the heartbeat's: the stale beat must be what tells
HEARTBEAT_TIMEOUT = 1.5
STORE_TIMEOUT = 5.0  # the client's store timeout (it does not bound a request)
MARGIN = 3.0  # scheduling on a busy 2-core machine
JOB = ElasticJob(epochs=3, token="link", collective_timeout=COLLECTIVE_TIMEOUT,
                 heartbeat_timeout=HEARTBEAT_TIMEOUT, store_timeout=STORE_TIMEOUT,
                 step_pause=0.05)
# The cut-off worker: its collective times out, then its rendezvous gives up.
VICTIM_EXIT_BOUND = COLLECTIVE_TIMEOUT + 2 * STORE_TIMEOUT + MARGIN


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@dataclass(frozen=True)
class Host:
    netns: str
    address: str
    port: str  # the root-side end of its veth pair, on the bridge


@dataclass(frozen=True)
class Network:
    bridge_address: str
    hosts: tuple[Host, ...]


def _free_subnet() -> int:
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True,
                          timeout=10).stdout
    free = [s for s in range(1, 250) if f"10.234.{s}." not in used]
    return random.choice(free)


@pytest.fixture
def network() -> Iterator[Network]:
    """Three namespaces on a bridge in the root namespace; all deleted afterwards."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root and iproute2 (`ip netns`) to give each worker its own host")
    tag = f"{random.randrange(16**5):05x}"
    subnet = _free_subnet()
    bridge = f"plbr{tag}"
    created: list[str] = []
    hosts = []
    try:
        try:
            _ip("link", "add", bridge, "type", "bridge")
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot create a bridge: {exc.stderr.decode().strip()}")
        _ip("addr", "add", f"10.234.{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i in range(3):
            host = Host(f"pl-link{i}-{tag}", f"10.234.{subnet}.{10 + i}", f"plr{i}{tag}")
            _ip("netns", "add", host.netns)
            created.append(host.netns)
            _ip("link", "add", host.port, "type", "veth", "peer", "name", "eth0",
                "netns", host.netns)
            _ip("link", "set", host.port, "master", bridge)
            _ip("link", "set", host.port, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            hosts.append(host)
        yield Network(f"10.234.{subnet}.1", tuple(hosts))
    finally:
        for name in created:  # deleting a namespace deletes its veth pair
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=10)
        leaked = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                timeout=10).stdout
        assert tag not in leaked, f"namespaces left behind: {leaked}"


def _start(host: Host, rank: int, store_addr: str, port: int, workdir: Path,
           cut_at: int | None) -> subprocess.Popen[bytes]:
    config = {"rank": rank, "store_addr": store_addr, "port": port, "host": host.address,
              "workdir": str(workdir), "cut_at": cut_at, "job": asdict(JOB)}
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    with (workdir / f"rank{rank}.log").open("wb") as log:
        return subprocess.Popen(
            ["ip", "netns", "exec", host.netns, sys.executable, "-m",
             "tests.distributed.link_worker", json.dumps(config)],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )


def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear in {timeout} s"
        time.sleep(0.01)


def _await_victim(victim: subprocess.Popen[bytes], down_at: float, workdir: Path) -> str:
    """How the cut-off worker ended: by itself, with a clear error, within the bound.

    After its collective times out it asks the store for the next generation, and a
    TCPStore request over a dead link blocks until TCP gives up (about 15 minutes),
    whatever the client's timeout; the cohort's guard must give up first. If it hangs,
    its stacks go to its log, it is killed, and the test fails.
    """
    try:
        code = victim.wait(timeout=max(0.0, down_at + VICTIM_EXIT_BOUND - time.time()))
    except subprocess.TimeoutExpired:
        victim.send_signal(signal.SIGUSR1)  # its threads' stacks, into its log
        time.sleep(1.0)
        log = (workdir / f"rank{VICTIM}.log").read_text()
        stack = log[log.rindex("Current thread"):] if "Current thread" in log else log
        victim.kill()
        victim.wait(timeout=10)
        raised = workdir / f"rank{VICTIM}.error.json"
        when = (f"it raised {json.loads(raised.read_text())['at'] - down_at:.1f} s after "
                "the cut" if raised.exists() else "it raised nothing")
        message = f"still runs {VICTIM_EXIT_BOUND:g} s after the cut ({when}):\n{stack}"
        raise AssertionError(message) from None
    error = json.loads((workdir / f"rank{VICTIM}.error.json").read_text())
    assert code != 0 and error["type"] == "RendezvousError", error
    assert "cannot reach the job's store" in error["message"], error
    return (f"exited by itself with code {code}, {time.time() - down_at:.1f} s after the "
            f"cut: {error['type']}: {error['message'][:300]}")


@pytest.mark.timeout(180)
def test_link_down_survivors_redo_the_step_and_finish(network: Network,
                                                      tmp_path: Path) -> None:
    from torch.distributed import TCPStore

    port = free_port()
    store = TCPStore(network.bridge_address, port, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=30))
    procs = [_start(host, rank, network.bridge_address, port, tmp_path,
                    CUT_AT if rank == VICTIM else None)
             for rank, host in enumerate(network.hosts)]
    victim = procs[VICTIM]
    try:
        _wait_for(tmp_path / "at-cut", timeout=90)
        _ip("link", "set", network.hosts[VICTIM].port, "down")
        down_at = time.time()
        (tmp_path / "link-down").write_text(f"{down_at:.6f}")
        for rank, proc in enumerate(procs):
            if rank != VICTIM:
                assert proc.wait(timeout=90) == 0, (tmp_path / f"rank{rank}.log").read_text()
        victim_end = _await_victim(victim, down_at, tmp_path)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        del store
    print(f"cut-off worker: {victim_end}")
    assert victim.returncode != 0

    expected = single_process(JOB)
    for rank in (r for r in range(3) if r != VICTIM):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        for name, value in expected.items():
            torch.testing.assert_close(result["params"][name], value, rtol=1e-9, atol=1e-12)
        (event,) = result["events"]
        assert event["left"] == [f"worker-{VICTIM}"] and event["joined"] == []
        assert event["world_size"] == 2 and event["generation"] == 1
        assert result["redone"] == 1
        # Noticed at the collective timeout (a silent peer: no error, no closed socket).
        noticed = result["detected_at"] - down_at
        assert HEARTBEAT_TIMEOUT - 0.5 < noticed < HEARTBEAT_TIMEOUT + MARGIN, noticed
        # Its heartbeat went stale with the link: the next generation forms at once.
        assert event["recovery_s"] < HEARTBEAT_TIMEOUT + MARGIN, event
        print(f"rank {rank}: noticed {noticed:.2f} s after the link went down, next "
              f"generation {event['recovery_s']:.2f} s later")
    assert_exactly_once(tmp_path, JOB.samples, JOB.epochs)
    assert not leftover_processes(tmp_path)
