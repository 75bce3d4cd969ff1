"""Two linked hosts (``machine/netns.py``) leave nothing behind when their process is
stopped with SIGTERM (a bench stopped with ``kill``), as they do on an exception.
Needs root and iproute2, like the WAN bench; CI's machine has both."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from potluck_lab.machine.netns import unavailable

HOLDER = """
import sys, time
from potluck_lab.machine.netns import LinkedHosts
with LinkedHosts("pl-test") as hosts:
    print(" ".join(hosts.names), flush=True)
    time.sleep(60)
"""


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


@pytest.mark.timeout(60)
def test_sigterm_deletes_the_namespaces() -> None:
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None
        names = holder.stdout.readline().split()
        assert len(names) == 2 and set(names) <= _namespaces()
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(timeout=30) == 128 + signal.SIGTERM
        assert not set(names) & _namespaces()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
