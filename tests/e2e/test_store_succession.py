"""The job's store outlives its host: three nodes, node 0 (the store's host) lost mid-run.

Three ``potluck run --elastic`` agents, one worker each. Node 0 hosts the store. Once
training runs, node 0 is killed outright (its agent, with the store, and its worker).
The store moves to node 1's agent (the first reachable successor), the two survivors
are a majority of the three and form the next generation, redo the step in flight and
finish. Node 0's command run again meanwhile refuses to host a second store for the job
and says how to join the running one. Every global batch is trained exactly once with
equal shares and a mean loss, so the final parameters equal one process on the same
global batches (float64). Every node has ``--status-port``: the page moves with the
store, and shows the two survivors.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from potluck.testing import free_port
from tests.e2e.helpers import ROOT, SCRIPT, assert_equal_to_one_process, kill_leftovers

EPOCHS = 8


def _node(rank: int, port: int, log: Path, out: Path, tmp: Path, status: int, *,
          epochs: int = EPOCHS, where: tuple[str, ...] = ("--nnodes", "3"),
          ) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "potluck", "run", *where, "--node-rank",
             str(rank), "--master-port", str(port), "--nproc-per-node", "1", "--elastic",
             "--token", "s3cret-succession", "--run-id", "succession", "--status-port",
             str(status), str(SCRIPT),
             "--epochs", str(epochs), "--step-time", "0.1", "--out", str(out),
             "--checkpoint-dir", str(tmp / f"checkpoints{rank}")],
            stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)


@pytest.mark.timeout(150)
def test_the_store_moves_when_its_host_is_killed_and_the_run_equals_one_process(
        tmp_path: Path) -> None:
    port, status, out = free_port(), free_port(), tmp_path / "final.pt"
    logs = [tmp_path / f"node{n}.log" for n in range(3)]
    nodes = [_node(n, port, logs[n], out, tmp_path, status) for n in range(3)]
    try:
        # (rank 0 prints; in an elastic job it is whichever worker joined first)
        while not any("epoch 1 done" in log.read_text() for log in logs):
            for n, node in enumerate(nodes):
                assert node.poll() is None, f"node {n}:\n{logs[n].read_text()[-3000:]}"
            time.sleep(0.1)
        os.killpg(nodes[0].pid, signal.SIGKILL)  # the agent, its store, its worker
        nodes[0].wait()
        while "it moved to node 1 at " not in logs[1].read_text():
            assert nodes[1].poll() is None, logs[1].read_text()[-3000:]
            time.sleep(0.1)
        page = _moved_page(logs[1], nodes[1], status)
        # Node 0's command again: it must not host a second store for the same job.
        again = tmp_path / "node0-again.log"
        nodes.append(_node(0, port, again, out, tmp_path, status))
        assert nodes[3].wait(timeout=60) == 2, again.read_text()[-3000:]
        for node in nodes[1:3]:
            node.wait()  # (the test's timeout bounds it)
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
        kill_leftovers(nodes)
    texts = [log.read_text() for log in logs]
    for n in (1, 2):
        assert nodes[n].returncode == 0, texts[n][-3000:]
        assert "it moved to node 1 at " in texts[n], texts[n][-3000:]
        for noise in ("frame #", "Exception raised from", "Traceback"):
            assert noise not in texts[n], f"{noise!r} on node {n}:\n{texts[n][-3000:]}"
    refused = again.read_text()
    assert "job 'succession' is still running without this node: its store moved to node 1" \
        in refused, refused[-3000:]
    assert "--master-addr 127.0.0.1 --master-port " in refused
    finished = texts[1] + texts[2]
    assert f"epoch {EPOCHS - 1} done at step {EPOCHS * 8} with 2 workers" in finished
    assert_equal_to_one_process(out, EPOCHS)
    # the status page went with the store: node 1 serves it, the survivors' pulses on it
    assert len(page["ranks"]) == 2, page["ranks"]
    assert any(e["what"] == "store" and "moved to node 1" in e["text"]
               for e in page["events"]), page["events"]


def _moved_page(log: Path, node: subprocess.Popen[bytes], port: int) -> dict[str, Any]:
    """The status page node 1 serves once the store moved there, as soon as both
    survivors' pulses are on it (its JSON)."""
    url = f"http://127.0.0.1:{port}/"
    while f"the status page is now at {url}" not in log.read_text():
        assert node.poll() is None, log.read_text()[-3000:]
        time.sleep(0.1)
    while True:
        assert node.poll() is None, log.read_text()[-3000:]
        with urllib.request.urlopen(f"{url}api/status", timeout=5) as answer:
            page: dict[str, Any] = json.load(answer)
        if len(page["ranks"]) == 2:
            return page
        time.sleep(0.2)


@pytest.mark.timeout(180)
def test_node_0_started_again_as_the_late_node_it_is_told_to_be_joins_the_moved_store(
        tmp_path: Path) -> None:
    """Node 0 lost, its command run again: refused, with the late node's command. Run
    as told (a node rank of its own, ``--nnodes MIN:MAX``, the moved store's address),
    it is admitted and trains with the survivors. (Before, it waited for node 0's worker
    count, which the moved store did not hold, until its join timeout.)"""
    port, status, out = free_port(), free_port(), tmp_path / "final.pt"
    logs = [tmp_path / f"node{n}.log" for n in range(3)]
    long = 200  # epochs: the test ends the job once the late node trained
    nodes = [_node(n, port, logs[n], out, tmp_path, status, epochs=long) for n in range(3)]
    try:
        while not any("epoch 1 done" in log.read_text() for log in logs):
            for n, node in enumerate(nodes):
                assert node.poll() is None, f"node {n}:\n{logs[n].read_text()[-3000:]}"
            time.sleep(0.1)
        os.killpg(nodes[0].pid, signal.SIGKILL)
        nodes[0].wait()
        while "it moved to node 1 at " not in logs[1].read_text():
            assert nodes[1].poll() is None, logs[1].read_text()[-3000:]
            time.sleep(0.1)
        again = tmp_path / "node0-again.log"
        nodes.append(_node(0, port, again, out, tmp_path, status, epochs=long))
        assert nodes[3].wait(timeout=60) == 2, again.read_text()[-3000:]
        told = re.search(r"--master-addr (\S+) --master-port (\d+)", again.read_text())
        assert told is not None, again.read_text()[-3000:]
        late = tmp_path / "late.log"
        nodes.append(_node(3, int(told[2]), late, out, tmp_path, status, epochs=long,
                           where=("--nnodes", "2:4", "--master-addr", told[1])))
        while "joined at step" not in late.read_text():
            for n, log in ((1, logs[1]), (2, logs[2]), (4, late)):
                assert nodes[n].poll() is None, f"node {n}:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        while not any("with 3 workers" in log.read_text() for log in (*logs[1:], late)):
            for n, log in ((1, logs[1]), (2, logs[2]), (4, late)):
                assert nodes[n].poll() is None, f"node {n}:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
    finally:
        kill_leftovers(nodes)
        for node in nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
