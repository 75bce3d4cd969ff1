"""The warm spare of an elastic job: a restarted worker is a process that imported torch
before it was needed, runs the script with its own slot's variables at normal CPU
priority, and no spare outlives the launcher. ``--no-warm-spare`` starts it cold."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.e2e.helpers import SCRIPTS, potluck_run

PROBE = SCRIPTS / "spare_probe.py"


def _probe_processes(probe: Path) -> list[int]:
    """Live processes running ``probe`` (this test's own copy: workers or spares)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(probe).encode() in cmdline:
            found.append(int(entry.name))
    return found


def _run(tmp_path: Path, *flags: str) -> str:
    probe = Path(shutil.copy(PROBE, tmp_path / PROBE.name))
    result = potluck_run("--nproc-per-node", "2", "--elastic", "--token", "s3cret-token",
                         "--max-restarts", "1", *flags, str(probe), "--flag", "x",
                         timeout=80)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "restarting local rank 1 as a new member (1 of 1 restarts)" in result.stderr
    assert _probe_processes(probe) == []  # no worker and no spare left behind
    return result.stdout


@pytest.mark.timeout(100)
def test_restarted_worker_is_the_warm_spare_with_its_own_variables(tmp_path: Path) -> None:
    out = _run(tmp_path)
    restarted = [line for line in out.splitlines() if line.startswith("[worker1]: ")]
    assert len(restarted) == 1, out
    line = restarted[0]
    assert "local rank 1 restart 1 argv ['--flag', 'x']" in line, line
    assert "torch preloaded True" in line, line  # imported by the spare, not the script
    assert f"nice {os.getpriority(os.PRIO_PROCESS, 0)} " in line, line  # priority back
    assert "standby None" in line, line  # the spare's pipe is not the worker's business
    first = [line for line in out.splitlines() if line.startswith("[worker0]: ")]
    group = first[0].split(" autogroup ")[1].split()[0] if first else None
    assert first == ["[worker0]: local rank 0 restart 0 argv ['--flag', 'x'] "
                     f"torch preloaded False nice {os.getpriority(os.PRIO_PROCESS, 0)} "
                     f"autogroup {group} standby None"], out
    assert f" autogroup {group} " in line and group != "19", (group, line)  # its own again


@pytest.mark.timeout(100)
def test_no_warm_spare_restarts_cold(tmp_path: Path) -> None:
    out = _run(tmp_path, "--no-warm-spare")
    assert "[worker1]: local rank 1 restart 1" in out and "torch preloaded False" in out
    assert "torch preloaded True" not in out, out
