"""The launcher starts its workers before it imports torch: the CLI and the agent import
no torch until the store is served, and a worker that connects early is served then."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta

import pytest

from potluck.errors import ConfigError
from potluck.launch.config import LaunchConfig
from potluck.launch.store import JobStore


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout.strip()


@pytest.mark.timeout(90)
def test_cli_and_agent_import_no_torch_until_the_store_is_served() -> None:
    out = _python(
        "import sys\n"
        "from potluck.cli import build_parser\n"
        "words = ['run', '--nproc-per-node', '2', 'train.py']\n"
        "build_parser(words).parse_args(words)\n"
        "import potluck, potluck.launch.agent, potluck.launch.worker\n"
        "print('torch' in sys.modules)\n"
        "potluck.prepare  # the public API is still there, imported on first use\n"
        "print('torch' in sys.modules)\n")
    assert out.splitlines() == ["False", "True"]
    version = subprocess.run([sys.executable, "-m", "potluck", "--version"],
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("potluck 0.")


@pytest.mark.timeout(60)
def test_a_worker_that_connects_before_the_store_is_served_waits_for_it() -> None:
    from torch._C._distributed_c10d import TCPStore

    job = JobStore(LaunchConfig(script="train.py", join_timeout=20),
                   stopping=lambda: False)
    answers: list[bytes] = []

    def early_worker() -> None:  # connects while nothing serves yet
        client = TCPStore("127.0.0.1", job.port, None, False, timedelta(seconds=20))
        answers.append(client.get("ready"))

    thread = threading.Thread(target=early_worker)
    thread.start()
    thread.join(timeout=0.5)
    assert thread.is_alive() and not answers  # waiting in the listen backlog
    job.get().set("ready", "yes")
    thread.join(timeout=20)
    assert answers == [b"yes"]


def test_a_port_in_use_is_refused_before_any_worker_starts() -> None:
    first = JobStore(LaunchConfig(script="train.py"), stopping=lambda: False)
    with pytest.raises(ConfigError, match=f"cannot host the store on port {first.port}"):
        JobStore(LaunchConfig(script="train.py", master_port=first.port),
                 stopping=lambda: False)
