"""Helpers for running ``potluck run`` as a user would, as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from potluck import DataCursor

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "minimal.py"
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def potluck_run(*argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "potluck", "run", *argv],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )


GRACE_S = 10.0  # a leftover's time to clean up after SIGTERM (its namespaces, its group)


def kill_leftovers(procs: Iterable[subprocess.Popen[Any]]) -> None:
    """End and reap whichever of ``procs`` still runs (a test's ``finally``): SIGTERM
    first, so a bench or demo deletes the network namespaces it made (a SIGKILL leaves
    them behind), then SIGKILL for any that did not end within ``GRACE_S``."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.terminate()
    for proc in running:
        try:  # (its pipes read meanwhile: a full one would block its clean-up)
            proc.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def run_to_end(argv: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True)``, but a run past ``timeout``
    is ended as ``kill_leftovers`` ends it (``subprocess.run`` sends SIGKILL), and then
    raises ``subprocess.TimeoutExpired`` with what it printed."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


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


# examples/elastic.py's job, and what one process makes of it: its elastic runs are
# checked against that.
SCRIPT = ROOT / "examples" / "elastic.py"
EPOCHS = 3


def one_process(epochs: int = EPOCHS) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)  # as examples/elastic.py makes them
    data = TensorDataset(*torch.randn(2, 96, 8, dtype=torch.float64, generator=gen))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                              torch.nn.Linear(32, 8)).double()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    cursor = DataCursor(len(data), 12, seed=3)
    while cursor.epoch < epochs:
        x, y = data[cursor.global_indices()]
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        cursor.commit()
    return net.state_dict()


def assert_equal_to_one_process(path: Path, epochs: int = EPOCHS) -> None:
    final, expected = torch.load(path), one_process(epochs)
    for name, value in expected.items():
        torch.testing.assert_close(final[name], value, rtol=1e-9, atol=1e-12)
