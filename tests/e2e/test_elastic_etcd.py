"""``potluck run --elastic --rdzv-backend etcd``: the job's store in a real etcd server
(``tests/etcd.py``: installed with apt-get when missing on a root Debian machine,
skipped elsewhere), so no node hosts it.

- Two nodes on loopback train ``examples/elastic.py`` to the end, and the result equals
  one process on the global batch. Node 0 deletes the job's keys at the end.
- Three nodes; node 0 (agent and worker) is killed outright once training runs. etcd
  holds the membership, so nodes 1 and 2 (two of three: a majority) go on and finish.
  With two nodes, node 1 alone would be half the cohort without its first member, and
  it would stop with ``NoQuorumError`` (``rendezvous/state.py``), as on a hosted store.
- etcd unreachable at the start, etcd lost mid-run, and an ended job's keys under the
  same run id: each one line naming the endpoint and the fix.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from potluck import keys
from potluck.etcd_store import EtcdStore, job_prefix
from potluck.launch.roll import agent_beats
from potluck.relay import RelayStore
from potluck.testing import free_port
from tests import etcd
from tests.e2e.helpers import ROOT, assert_equal_to_one_process, kill_leftovers, pid_alive

SCRIPT = ROOT / "examples" / "elastic.py"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[etcd.Etcd]:
    why = etcd.why_no_etcd()
    if why is not None:
        pytest.skip(why)
    with etcd.server(tmp_path / "etcd") as running:
        yield running


def _node(endpoint: str, rank: int, nnodes: int, run_id: str, log: Path,
          *script_args: str) -> subprocess.Popen[bytes]:
    """One node's ``potluck run`` with its store in etcd; stdout and stderr in ``log``."""
    with log.open("wb") as sink:  # the child holds its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "potluck", "run", "--nnodes", str(nnodes), "--node-rank",
             str(rank), "--nproc-per-node", "1", "--elastic", "--token", "s3cret-etcd-job",
             "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint, "--run-id", run_id,
             "--join-timeout", "60", str(SCRIPT), *script_args],
            stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.timeout(240)  # a first apt-get install of etcd-server, then the job
def test_two_nodes_on_etcd_equal_one_process(server: etcd.Etcd, tmp_path: Path) -> None:
    out = tmp_path / "final.pt"
    logs = [tmp_path / f"node{rank}.log" for rank in range(2)]
    nodes = [_node(server.endpoint, rank, 2, "etcd-equal", logs[rank], "--out", str(out),
                   "--epochs", "3", "--step-time", "0") for rank in range(2)]
    job = EtcdStore(server.endpoint, job_prefix("etcd-equal"), timedelta(seconds=5))
    try:
        seen: list[str] = []
        while not any(key.startswith("potluck/etcd-equal/rdzv/") for key in seen):
            assert all(node.poll() is None for node in nodes), logs[0].read_text()[-3000:]
            seen = job.list_keys()  # the cohort meets in etcd
            time.sleep(0.05)
        for node in nodes:
            node.wait(timeout=150)
    finally:
        kill_leftovers(nodes)
    texts = [log.read_text() for log in logs]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(t[-3000:] for t in texts)
    assert any("epoch 2 done at step 24 with 2 workers" in t for t in texts), texts
    assert_equal_to_one_process(out)
    assert job.list_keys() == []  # node 0 deleted the job's keys at the end


@pytest.mark.timeout(240)
def test_losing_node_0_loses_nothing_of_the_membership(server: etcd.Etcd,
                                                       tmp_path: Path) -> None:
    out = tmp_path / "final.pt"
    logs = [tmp_path / f"node{rank}.log" for rank in range(3)]
    nodes = [_node(server.endpoint, rank, 3, "etcd-lost", logs[rank], "--epochs", "6",
                   "--step-time", "0.05", "--out", str(out)) for rank in range(3)]
    try:
        # No deadline of our own: the event, a node's exit, or the test's timeout.
        while not any("epoch 0 done" in log.read_text() for log in logs):
            assert all(node.poll() is None for node in nodes), logs[0].read_text()[-3000:]
            time.sleep(0.1)
        lost = _children(nodes[0].pid)  # node 0's worker (and any warm spare)
        nodes[0].kill()  # the whole node: its agent, then its worker (no goodbye)
        for worker in lost:
            os.kill(worker, signal.SIGKILL)
        nodes[0].wait()
        for node in nodes[1:]:
            node.wait(timeout=150)
    finally:
        kill_leftovers(nodes)
    texts = [log.read_text() for log in logs[1:]]
    assert [node.returncode for node in nodes[1:]] == [0, 0], \
        "\n".join(t[-3000:] for t in texts)
    assert any("epoch 5 done" in text and "with 2 workers" in text for text in texts), \
        "\n".join(t[-3000:] for t in texts)
    assert not any(pid_alive(worker) for worker in lost)
    assert_equal_to_one_process(out, epochs=6)  # the lost step was redone, not skipped


@pytest.mark.timeout(60)
def test_etcd_unreachable_at_the_start_is_one_line(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "potluck", "run", "--elastic", "--token", "s3cret-etcd-job",
         "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint, str(SCRIPT)],
        capture_output=True, text=True, timeout=50, cwd=ROOT)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"cannot reach etcd at {endpoint}" in lines[0], done.stderr
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.timeout(180)
def test_etcd_lost_mid_run_is_one_line_per_process_not_a_traceback(
        server: etcd.Etcd, tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    with log.open("wb") as sink:
        job = subprocess.Popen(
            [sys.executable, "-m", "potluck", "run", "--nproc-per-node", "2", "--elastic",
             "--token", "s3cret-etcd-job", "--rdzv-backend", "etcd", "--rdzv-endpoint",
             server.endpoint, "--run-id", "etcd-gone", str(SCRIPT), "--epochs", "50",
             "--step-time", "0.05"],
            stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        while "epoch 0 done" not in log.read_text():
            assert job.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        etcd.stop(server.process)  # the whole etcd cluster, as a lost one would be
        job.wait(timeout=150)  # (each call retries for LOST_AFTER_S first)
    finally:
        kill_leftovers([job])
    text = log.read_text()
    assert job.returncode == 1, text[-3000:]
    assert f"StoreLostError: the job's store in etcd at {server.endpoint} is gone" in text
    for noise in ("Traceback", "frame #", "Exception raised from", "grpc"):
        assert noise not in text, f"{noise!r} in the job's output:\n{text[-3000:]}"


@pytest.mark.timeout(120)
def test_an_ended_jobs_keys_under_the_run_id_are_refused_in_one_line(
        server: etcd.Etcd) -> None:
    # What a job whose node 0 was lost leaves: node 0's count, one agent on the roll,
    # its last beat long ago.
    left = RelayStore(EtcdStore(server.endpoint, job_prefix("stale")), server.endpoint)
    left.set(keys.agents("stale", "nproc0"), "1")
    left.add(keys.agents("stale", "started"), 1)
    agent_beats(left, "stale").set(keys.heartbeat("agent0"), "1000.0")
    for rank, why in ((0, "it ended"), (1, "its agents no longer beat: it ended")):
        done = subprocess.run(
            [sys.executable, "-m", "potluck", "run", "--elastic", "--nnodes", "2",
             "--node-rank", str(rank), "--token", "s3cret-etcd-job", "--rdzv-backend",
             "etcd", "--rdzv-endpoint", server.endpoint, "--run-id", "stale", str(SCRIPT)],
            capture_output=True, text=True, timeout=60, cwd=ROOT)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2, done.stderr + done.stdout
        assert len(lines) == 1 and "already holds the keys of a job with --run-id " \
            f"stale ({why}): give this job a --run-id of its own" in lines[0], done.stderr
        assert "del --prefix /potluck/stale/" in lines[0] and not done.stdout.strip()
