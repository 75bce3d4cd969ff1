"""A host cut off the switch (``BridgedHosts.cut``) is reached again once mended: the
cohort bench cuts the store's host in one contender's run and mends it before the next
one's. Needs root and iproute2, like the benches."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from potluck_lab.machine.netns import BridgedHosts
from tests.e2e.store_hosts import bridged_hosts

# Connect to host 0's address from the namespace this runs in: 0 connected, 1 not.
PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()
except OSError:
    sys.exit(1)
"""
# Listen on every address in host 0's namespace until killed.
LISTEN = """
import socket, sys, time
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("up", flush=True)
while True:
    connection, _ = server.accept()
    connection.close()
"""
PORT = 23456  # (in namespaces of the test's own: nothing else listens there)


@pytest.fixture
def hosts() -> Iterator[BridgedHosts]:
    yield from bridged_hosts(2)


def _reaches(hosts: BridgedHosts) -> bool:
    probe = hosts.command(1, [sys.executable, "-c", PROBE, hosts.addresses[0], str(PORT)])
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


@pytest.mark.timeout(60)
def test_a_cut_host_is_reached_again_once_mended(hosts: BridgedHosts) -> None:
    server = subprocess.Popen(hosts.command(0, [sys.executable, "-c", LISTEN, str(PORT)]),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        assert _reaches(hosts)
        hosts.cut(0)
        assert not _reaches(hosts)
        hosts.mend(0)
        assert _reaches(hosts)
    finally:
        server.kill()
        server.wait(timeout=10)
