"""What every test shares: the longest tests first (``tests/order.py``), the leak
checks (``tests/leaks.py``: a test that leaves an environment variable changed, a thread
running, a child process alive or a port listening fails), a cache directory of the
session's own, and small fixtures."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from potluck.testing import free_port as _free_port

pytest_plugins = ["tests.leaks", "tests.order"]

# What `potluck run` keeps on a machine between runs (a multi-node elastic job's
# successor addresses, under ~/.cache/potluck) goes to a directory of this session's.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="potluck-tests-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)


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
