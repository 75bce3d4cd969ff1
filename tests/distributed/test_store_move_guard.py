"""While the job's store moves, no worker is judged cut off by its own silence.

A worker's rendezvous gives up (``RendezvousError``: "cannot reach the job's store")
once none of its heartbeats got through for ``heartbeat_timeout``
(``store_silent_since``): the others have counted it out by then. While the store
moves to a successor, nobody's beats get through and nobody counts anyone out; after
the move, this worker's beat is on the new store (written back by the move). So a
move slower than the timeout (the successor's agent yet to serve, a loaded machine)
must not make a worker give up: it did, in one of 20 chaos trials."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from torch._C._distributed_c10d import TCPStore

from potluck.relay import RelayStore
from potluck.rendezvous.membership import RendezvousConfig
from potluck.rendezvous.store_rendezvous import StoreRendezvous
from potluck.succession import Candidate, Succession, publish
from potluck.testing import free_port

TIMEOUT = 0.5  # heartbeat_timeout
MOVE_S = 1.5  # how long the successor takes to answer


@pytest.mark.timeout(60)
def test_a_slow_move_of_the_store_does_not_count_as_silence() -> None:
    old, new = free_port(), free_port()
    host = TCPStore("127.0.0.1", old, None, True, timedelta(seconds=10),
                    wait_for_workers=False)
    successor = TCPStore("127.0.0.1", new, None, True, timedelta(seconds=10),
                         wait_for_workers=False)

    serving: list[float] = []  # when the successor's agent serves (monotonic)

    def connect(candidate: Candidate) -> TCPStore:
        if candidate.port == new:  # its agent has yet to see the loss and serve
            serving.append(serving[0] if serving else time.monotonic() + MOVE_S)
            time.sleep(max(0.0, serving[0] - time.monotonic()))
        return TCPStore("127.0.0.1", candidate.port, is_master=False,
                        timeout=timedelta(seconds=10))

    client = connect(Candidate(0, "127.0.0.1", old))
    publish(client, "run", Candidate(1, "127.0.0.1", new))
    succession = Succession("run", f"127.0.0.1:{old}", connect=connect)
    succession.learn(client)
    rendezvous = StoreRendezvous(
        RelayStore(client, f"127.0.0.1:{old}", succession=succession), "w0",
        RendezvousConfig(token="t", heartbeat_interval=0.05, heartbeat_timeout=TIMEOUT))
    rendezvous.join()
    worst, started = 0.0, time.monotonic()
    try:
        del host  # the store's host is gone: the next beat moves the store
        while succession.moves == 0 or time.monotonic() - started < MOVE_S + 1.0:
            worst = max(worst, rendezvous.store_silent_since(started))
            assert time.monotonic() - started < 20, "the store never moved"
            time.sleep(0.01)
    finally:
        rendezvous.close()
    assert succession.where == f"127.0.0.1:{new}"
    assert worst < TIMEOUT, f"silent for {worst:.2f} s while the store moved"
    assert not [t for t in threading.enumerate() if t.name.startswith("potluck-heart")]
    del successor
