"""Helpers for running ``potluck run`` as a user would, as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "minimal.py"
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def potluck_run(*argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "potluck", "run", *argv],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )


def kill_leftovers(procs: Iterable[subprocess.Popen[Any]]) -> None:
    """Kill and reap whichever of ``procs`` still runs (a test's ``finally``)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead, just not reaped by its (other) parent yet
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def pids_in(output: str) -> list[int]:
    """The pids that worker lines like ``[rank1]: pid 1234`` (``[worker1]: ...`` under
    --elastic) report."""
    return [int(line.split("pid ")[1].split()[0]) for line in output.splitlines()
            if line.startswith(("[rank", "[worker")) and "pid " in line]
