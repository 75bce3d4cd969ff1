"""``potluck run --status-port --metrics-dir`` on a plain DDP script: torch's
``init_process_group`` and ``potluck.DataParallel``, no ``potluck.prepare``.

The page lists both ranks with their step times while the script runs, and says in
words why samples/s stays blank. Each rank's journal holds one ``rank_step`` record per
optimizer step (a ``no_sync()`` micro-batch is not a step), which ``potluck plot``
reads. The launcher says once what the flags do not do without ``potluck.prepare``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from potluck.metrics.journal import read_journal
from potluck.metrics.plots import load_run, skipped_plots
from tests.e2e.helpers import ROOT, SCRIPTS


def _output(log: Path) -> str:
    return log.read_text() if log.exists() else ""


def _address(proc: subprocess.Popen[str], log: Path, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in _output(log).splitlines():
            if "status page at " in line:
                return line.split("status page at ")[1].split()[0]
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"no status page address; the launcher said:\n{_output(log)}")


def _status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "api/status", timeout=10) as answer:
        result: dict[str, Any] = json.loads(answer.read())
        return result


def _both_ranks_stepping(status: dict[str, Any]) -> bool:
    rows = {r["rank"]: r for r in status["ranks"]}
    return sorted(rows) == [0, 1] and all(
        r["step"] >= 1 and r["compute_ms"] is not None and r["step_ms"] is not None
        for r in rows.values())


@pytest.mark.timeout(60)
def test_the_page_and_the_journal_show_a_plain_ddp_scripts_ranks(tmp_path: Path) -> None:
    stop, metrics, log = tmp_path / "stop", tmp_path / "metrics", tmp_path / "launcher.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "potluck", "run", "--nproc-per-node", "2",
             "--status-port", "0", "--metrics-dir", str(metrics),
             str(SCRIPTS / "plain_potluck_ddp.py"), "--stop-file", str(stop)],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, text=True,
            start_new_session=True)
    try:
        url = _address(proc, log)
        deadline, status = time.monotonic() + 40, {}
        while time.monotonic() < deadline and proc.poll() is None:
            status = _status(url)
            if _both_ranks_stepping(status):
                break
            time.sleep(0.1)
        assert _both_ranks_stepping(status), (json.dumps(status)[:2000], _output(log))
        for row in status["ranks"]:  # unknown, not a wrong number
            assert row["samples"] is None and row["samples_per_s"] is None, row
            assert row["share"] is None and row["wait_ms"] is not None, row
        assert len(status["notices"]) == 1, status["notices"]
        assert status["notices"][0].startswith(
            "ranks 0, 1 train a potluck.DataParallel without potluck.prepare: its steps "
            "are timed, but the samples of a step are not known"), status["notices"]

        stop.write_text("stop")
        assert proc.wait(timeout=30) == 0, _output(log)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = _output(log)
    steps = int(said.split("steps: ")[1].split()[0])
    assert said.count("this script trains a potluck.DataParallel without "
                      "potluck.prepare(...), so it gets less from --status-port (") == 1, said
    assert "--metrics-dir (the journals in" in said and "take effect only" not in said

    journals = sorted((metrics / "ranks").glob("rank-*.jsonl"))
    assert len(journals) == 2, journals
    ranks = set()
    for journal in journals:
        records = [r for r in read_journal(journal) if r["kind"] == "rank_step"]
        assert [r["step"] for r in records] == list(range(steps)), (journal, records[:3])
        assert all(r["world_size"] == 2 and r["compute_s"] > 0 and "samples" not in r
                   for r in records), records[:3]
        ranks.add(records[0]["rank"])
    assert ranks == {0, 1}
    skipped = dict(skipped_plots(load_run(metrics)))
    assert "compute_wait.png" not in skipped
    assert set(skipped) >= {"throughput.png", "shares.png"}
