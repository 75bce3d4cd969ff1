"""A dead peer (SIGKILL) or a frozen one (SIGSTOP) is a PeerLostError on every survivor.

Ranks are separate processes on real Gloo; the test hosts the TCPStore like the
launcher's agent does, so the victim's death does not take the store with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from torch._C._distributed_c10d import TCPStore

WORKER = Path(__file__).with_name("fault_worker.py")
WORLD_SIZE = 3
VICTIM = WORLD_SIZE - 1


@pytest.fixture
def ranks(request: pytest.FixtureRequest) -> Iterator[list[subprocess.Popen[str]]]:
    timeout = request.param
    store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                     wait_for_workers=False)
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), str(WORLD_SIZE), str(store.port),
             str(timeout)],
            stdout=subprocess.PIPE, text=True,
        )
        for r in range(WORLD_SIZE)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert "ready" in proc.stdout.readline()
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.wait()


def _survivor_reports(procs: list[subprocess.Popen[str]], limit: float) -> list[dict]:
    reports = []
    for proc in procs[:VICTIM]:
        out, _ = proc.communicate(timeout=limit)
        assert proc.returncode == 0, out
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ranks", [30.0], indirect=True)
def test_killed_peer_fails_every_survivor_at_once(ranks: list[subprocess.Popen[str]]) -> None:
    killed_at = time.time()
    ranks[VICTIM].kill()
    reports = _survivor_reports(ranks, limit=20)
    for rank, report in enumerate(reports):
        assert report["error"] == "PeerLostError" and report["rank"] == rank
        assert report["generation"] == 0
        # at once: far below the 30 s collective timeout
        assert report["at"] - killed_at < 5.0, report


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ranks", [3.0], indirect=True)
def test_frozen_peer_fails_every_survivor_at_the_timeout(
    ranks: list[subprocess.Popen[str]],
) -> None:
    stopped_at = time.time()
    os.kill(ranks[VICTIM].pid, signal.SIGSTOP)
    reports = _survivor_reports(ranks, limit=20)
    for rank, report in enumerate(reports):
        assert report["error"] == "PeerLostError" and report["rank"] == rank
        waited = report["at"] - stopped_at
        assert 2.0 < waited < 8.0, report  # the 3 s timeout, not a hang nor at once
