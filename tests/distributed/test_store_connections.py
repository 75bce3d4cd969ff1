"""How many connections a process opens to the job's store, and what each costs it.

torch's store server accepts on its one thread and names each peer it accepts with a
reverse lookup. With 16 members the store stopped serving: every process opened a new
connection per generation's group and one probe per waiting thread every 2 s, and each
peer, seen through a dual-stack socket, cost a DNS query (5 s where DNS dropped one).
These tests count the connections through a proxy (``tests.store_proxy``), and check
the peers the agent's store socket sees.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from torch._C._distributed_c10d import TCPStore

from potluck.cohort.groups import GroupSpec, make_group
from potluck.launch.config import LaunchConfig
from potluck.launch.store import listen
from potluck.relay import SILENT_S, RelayStore, prefixed
from potluck.rendezvous.heartbeat import Heartbeat
from potluck.succession import Succession
from potluck.testing import hosted_store
from tests.store_proxy import CountingProxy


@pytest.fixture
def proxy() -> Iterator[CountingProxy]:
    """A counting proxy in front of a store this process hosts."""
    with hosted_store() as (port, _):
        counting = CountingProxy(port)
        try:
            yield counting
        finally:
            counting.close()


def _relay(proxy: CountingProxy, *, moves: bool = False) -> RelayStore:
    """A worker's relay to the store behind ``proxy`` (``moves``: with a succession, as
    across nodes, so a slow call probes the store's host)."""
    client = TCPStore("127.0.0.1", proxy.port, None, False, timedelta(seconds=10),
                      wait_for_workers=False)
    succession = Succession("job", proxy.where) if moves else None
    return RelayStore(client, proxy.where, succession=succession)


@pytest.mark.timeout(60)
def test_every_generations_group_holds_the_same_connection(proxy: CountingProxy) -> None:
    store = prefixed(_relay(proxy), "cohort")
    spec = GroupSpec("gloo", 10.0, "127.0.0.1")
    opened = proxy.connections
    for generation in range(10):
        group = make_group(spec, store, f"group/{generation}", 0, 1, generation)
        assert group.size() == 1
        del group
    # one client for every group (it was one connection per generation)
    assert proxy.connections - opened == 1
    store.set("after", "1")
    assert store.get("after") == b"1"


@pytest.mark.timeout(60)
def test_heartbeats_keep_their_one_connection(proxy: CountingProxy) -> None:
    store = _relay(proxy, moves=True)
    opened = proxy.connections
    beat = Heartbeat(store, "w0", interval=0.02).start()
    try:
        threading.Event().wait(1.0)  # about 50 beats
    finally:
        beat.stop()
    assert proxy.connections - opened == 1  # the heartbeat's own connection


@pytest.mark.timeout(60)
def test_threads_waiting_on_a_slow_store_probe_its_host_once(proxy: CountingProxy) -> None:
    root = _relay(proxy, moves=True)
    root.set("k", "1")
    relays = [root.clone() for _ in range(8)]  # a connection per thread, as they hold
    opened = proxy.connections
    answers: list[bool] = []

    def ask(relay: RelayStore) -> None:
        answers.append(relay.check(["k"]))

    threads = [threading.Thread(target=ask, args=(relay,)) for relay in relays]
    proxy.hold()  # the store's thread is busy: every call waits
    try:
        for thread in threads:
            thread.start()
        threading.Event().wait(2.5 * SILENT_S)  # past two probe times of each thread
    finally:
        proxy.release()
    for thread in threads:
        thread.join(30)
    assert answers == [True] * len(relays)
    # one probe for the whole process (it was one per thread every SILENT_S: 16 here)
    assert proxy.connections - opened == 1


@pytest.mark.timeout(30)
def test_the_agents_store_socket_sees_an_ipv4_peer_as_ipv4() -> None:
    """A dual-stack socket saw 127.0.0.1 as ::ffff:127.0.0.1, which no hosts file lists:
    torch's server asked DNS for each peer it accepted."""
    with listen(LaunchConfig("train.py", master_addr="127.0.0.1", master_port=0)) as server:
        assert server.family == socket.AF_INET
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            peer, address = server.accept()
            with peer:
                assert address[0] == "127.0.0.1"
                assert socket.getnameinfo(address, socket.NI_NAMEREQD)[0]  # hosts file
