"""What every test shares: the leak checks (``tests/leaks.py``: a test that leaves an
environment variable changed, a thread running, a child process alive or a port
listening fails), and small fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from potluck.testing import free_port as _free_port

pytest_plugins = ["tests.leaks"]


@pytest.fixture
def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    return _free_port()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A fresh directory for one run's checkpoints, metrics and logs."""
    path = tmp_path / "run"
    path.mkdir()
    return path
