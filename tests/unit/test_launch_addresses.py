"""A wrong ``--master-addr`` fails at once (node 0) or at the join timeout with one
message (other nodes), never with torch's 30 minutes of retries and C++ stack traces."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest
import torch.distributed  # noqa: F401  (join_store imports it: not inside the timing)

from potluck.errors import ConfigError, RendezvousError
from potluck.launch.config import LaunchConfig
from potluck.launch.store import check_local_address, join_store
from potluck.testing import free_port


def test_this_machines_addresses_are_accepted_on_node_0() -> None:
    for addr in ("127.0.0.1", "localhost", socket.gethostname()):
        check_local_address(addr)


def test_a_foreign_address_is_refused_on_node_0_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"'192\.0\.2\.7' is not an address of this machine"):
        check_local_address("192.0.2.7")  # TEST-NET-1: never a local address


def test_an_unresolvable_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="does not resolve"):
        check_local_address("no-such-host.invalid")


@pytest.mark.timeout(30)
def test_another_node_gives_up_at_the_join_timeout_with_one_message(
        capfd: pytest.CaptureFixture[str]) -> None:
    config = LaunchConfig(script="x.py", nnodes=2, node_rank=1, master_port=free_port(),
                          join_timeout=2.0)  # nothing listens on that port
    started = time.monotonic()
    with pytest.raises(RendezvousError, match=r"could not reach the store at 127\.0\.0\.1"):
        join_store(config, stopping=lambda: False)
    assert time.monotonic() - started < 2.0 + 3.0
    assert "frame #" not in capfd.readouterr().err  # no torch retry traces


@pytest.mark.timeout(30)
def test_something_that_is_not_the_store_fails_at_once() -> None:
    """As an HTTP proxy at the address answers: what a wrong --master-addr met here."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        answering = threading.Thread(target=_answer_http, args=(server,), daemon=True)
        answering.start()
        config = LaunchConfig(script="x.py", nnodes=2, node_rank=1,
                              master_port=server.getsockname()[1], join_timeout=60.0)
        started = time.monotonic()
        with pytest.raises(RendezvousError, match="is not a potluck job's store"):
            join_store(config, stopping=lambda: False)
        assert time.monotonic() - started < 15  # not the 60 s join timeout
        server.shutdown(socket.SHUT_RDWR)  # (its accept() returns: the thread ends)
    answering.join(timeout=5)


def _answer_http(server: socket.socket) -> None:
    with contextlib.suppress(OSError):  # the test closed the server
        while True:
            conn, _ = server.accept()
            with conn:
                conn.recv(64)  # torch's validation request, then the proxy's answer
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
