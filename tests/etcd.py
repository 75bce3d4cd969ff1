"""A real one-member etcd server for tests: install it, start it, stop it clean.

Debian's ``etcd-server`` package (etcd 3.4 on Debian 12) is installed with apt-get when
``etcd`` is missing on a root Debian machine; elsewhere the tests skip with the reason.
The server listens on two free loopback ports (client and peer), keeps its data in a
temp directory, and is killed and reaped when the ``server`` block ends.
"""

from __future__ import annotations

import contextlib
import http.client
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from potluck.testing import free_port
from tests import apt

START_TIMEOUT_S = 30.0


class Etcd(NamedTuple):
    endpoint: str
    process: subprocess.Popen[bytes]


def why_no_etcd() -> str | None:
    """Why there is no etcd to start here, after trying to install it; None: there is."""
    if shutil.which("etcd") is not None:
        return None
    why = apt.why_not_installable()
    if why is not None:
        return f"etcd is not installed and {why}"
    failure = apt.install("etcd-server", lambda: shutil.which("etcd") is not None)
    return None if failure is None else f"apt-get install etcd-server failed: {failure}"


@contextlib.contextmanager
def server(root: Path) -> Iterator[Etcd]:
    """A running etcd on loopback (its client endpoint is ``127.0.0.1:PORT``). The
    server is gone when the block ends."""
    client, peer = free_port(), free_port()
    while peer == client:
        peer = free_port()
    root.mkdir(parents=True, exist_ok=True)
    argv = ["etcd", "--name", "potluck-test", "--data-dir", str(root / "data"),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"potluck-test=http://127.0.0.1:{peer}",
            "--log-level", "error"]
    with (root / "etcd.out").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    try:
        _wait_ready(process, client, root)
        yield Etcd(f"127.0.0.1:{client}", process)
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    """Kill the server (as a lost host would be) and reap it."""
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


def _wait_ready(process: subprocess.Popen[bytes], port: int, root: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"etcd exited {process.returncode} at start:\n{logs(root)}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            try:
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    return
            finally:
                connection.close()
        time.sleep(0.1)
    raise RuntimeError(f"etcd did not answer in {START_TIMEOUT_S:.0f} s:\n{logs(root)}")


def logs(root: Path) -> str:
    """The server's last lines, for a failing test's message."""
    path = root / "etcd.out"
    return "\n".join(path.read_text().splitlines()[-15:]) if path.is_file() else ""
