"""``RelayStore``: the job's store as a worker holds it. Every call reaches the store;
a store whose host is gone is ``StoreLostError``, one line, from every call and from a
clone; a prefixed relay clones as a relay (c10d's ``PrefixStore`` cannot clone a store
written in Python)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from torch._C._distributed_c10d import PrefixStore, TCPStore

from potluck import relay
from potluck.errors import StoreLostError
from potluck.relay import SILENT_S, RelayStore, prefixed
from potluck.succession import Candidate, Succession, publish
from potluck.testing import free_port


def _start_host(port: int) -> Any:
    """A process hosting a store on ``port``, once it serves (a spawned process imports
    torch first: seconds on a busy machine, longer than a client's connect timeout)."""
    spawn = multiprocessing.get_context("spawn")
    up = spawn.Event()
    host = spawn.Process(target=_host, args=(port, up))
    host.start()
    if not up.wait(60):
        host.kill()
        host.join()
        raise AssertionError("the store's host did not start in 60 s")
    return host


def _stop(pid: int | None) -> None:
    """SIGSTOP a process and wait until it is stopped."""
    os.kill(pid or 0, signal.SIGSTOP)
    while "T (stopped)" not in Path(f"/proc/{pid}/status").read_text():
        time.sleep(0.01)


def _host(port: int, up: Any) -> None:
    store = TCPStore("127.0.0.1", port, None, True, timedelta(seconds=10),
                     wait_for_workers=False)
    store.set("up", "1")
    up.set()
    time.sleep(60)  # (killed by the test)


@pytest.mark.timeout(60)
def test_a_relay_reaches_the_store_and_a_lost_host_is_one_line() -> None:
    port = free_port()
    host = _start_host(port)
    try:
        inner = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        relay = RelayStore(inner, f"127.0.0.1:{port}")
        relay.wait(["up"])
        relay.set("a", "1")
        assert relay.get("a") == b"1" and relay.add("n", 2) == 2
        assert relay.compare_set("c", "", "x") == b"x" and relay.check(["a", "c"])
        assert relay.num_keys() >= 3 and relay.delete_key("a") and not relay.check(["a"])
        scoped = prefixed(relay, "job")
        assert isinstance(scoped, RelayStore)
        twin = getattr(scoped, "clone")()  # noqa: B009  (a thread's own connection)
        twin.set("k", "v")
        assert relay.get("job/k") == b"v" and isinstance(twin, RelayStore)
        assert isinstance(prefixed(inner, "job"), PrefixStore)  # (no relay: c10d's own)
        host.kill()
        host.join()
        for call in (lambda: relay.set("a", "2"), lambda: relay.get("n"),
                     lambda: relay.check(["n"]), lambda: twin.get("k")):
            with pytest.raises(StoreLostError) as lost:
                for _ in range(3):  # (a write may land in the dead socket's buffer once)
                    call()
            message = str(lost.value)
            assert message.startswith(f"the job's store at 127.0.0.1:{port} is gone (")
            assert "\n" not in message and "frame #" not in message
    finally:
        if host.is_alive():
            host.kill()
        host.join()


class _Moving:
    """A store's host process on ``old``, a successor's store on ``new`` published as
    node 1's candidate, and a succession that knows it; relays from ``relay()``. At the
    end the host is killed (a SIGKILL ends a stopped process too) and the successor's
    store let go."""

    def __init__(self) -> None:
        self.old, self.new = free_port(), free_port()
        self.host = _start_host(self.old)
        try:
            self.successor = TCPStore("127.0.0.1", self.new, None, True,
                                      timedelta(seconds=10), wait_for_workers=False)
            first = self._client(self.old)
            first.wait(["up"])
            publish(first, "run", Candidate(1, "127.0.0.1", self.new))
            self.succession = Succession("run", f"127.0.0.1:{self.old}",
                                         connect=lambda c: self._client(c.port))
            self.succession.learn(first)
        except BaseException:
            self.__exit__()
            raise

    @staticmethod
    def _client(port: int) -> TCPStore:
        return TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))

    def relay(self) -> RelayStore:
        return RelayStore(self._client(self.old), f"127.0.0.1:{self.old}",
                          succession=self.succession)

    def __enter__(self) -> _Moving:
        return self

    def __exit__(self, *exc: object) -> None:
        self.host.kill()
        self.host.join()
        self.__dict__.pop("successor", None)  # (its store stops listening)


@pytest.mark.timeout(60)
def test_a_relay_idle_while_the_store_moved_goes_to_the_new_host_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Relays of one process share a succession. The store's host goes silent (a cut
    link: SIGSTOP keeps its connections open, unanswered, and the probe of its socket
    is made to fail as over a cut link); the first relay waits out
    ``SILENT_S`` and moves the store; the second, idle meanwhile, then answers from the
    new host at once, and the third, whose call began halfway through the first's
    wait, gives up on the old host when the store moves instead of waiting out its
    own ``SILENT_S``."""
    with _Moving() as moving:
        host, succession, new = moving.host, moving.succession, moving.new
        relays = [moving.relay() for _ in range(3)]
        monkeypatch.setattr(succession, "host_accepts", lambda where: False)
        _stop(host.pid)
        waiting: list[float] = []  # when a third relay's call, made meanwhile, ends

        def meanwhile() -> None:
            time.sleep(SILENT_S / 2)
            relays[2].add("n", 1)
            waiting.append(time.monotonic())

        third = threading.Thread(target=meanwhile)
        third.start()
        relays[0].set("moved", "1")  # (SILENT_S, then on the successor)
        moved = time.monotonic()
        assert succession.where == f"127.0.0.1:{new}"
        assert relays[1].check(["moved"])
        assert time.monotonic() - moved < 1.0 < SILENT_S
        assert relays[1].where == f"127.0.0.1:{new}"
        third.join()  # it gave up on the silent host as soon as the store moved
        assert waiting[0] - moved < 1.0 and relays[2].add("n", 0) == 1


@pytest.mark.timeout(60)
def test_a_slow_store_whose_host_accepts_connections_is_waited_for_not_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that answers late (its process waited for a core on a busy machine: here
    SIGSTOP for 2.5 ``SILENT_S``) is not lost while its host's kernel accepts
    connections: the call answers from it once it runs again, and the store does not
    move (moving it would split the cohort between two stores). One that never answers
    is lost after ``FROZEN_S``."""
    with _Moving() as moving:
        host, succession, old, new = moving.host, moving.succession, moving.old, moving.new
        store = moving.relay()
        _stop(host.pid)
        resumed: list[float] = []

        def _resume() -> None:
            resumed.append(time.monotonic())  # (before the signal: the answer comes after)
            os.kill(host.pid or 0, signal.SIGCONT)

        resume = threading.Timer(2.5 * SILENT_S, _resume)
        resume.start()
        assert store.add("n", 1) == 1  # answered by the slow host, once it ran again
        answered = time.monotonic()
        assert resumed and answered >= resumed[0]
        assert succession.moves == 0 and store.where == f"127.0.0.1:{old}"
        resume.join()
        monkeypatch.setattr(relay, "FROZEN_S", 1.5 * SILENT_S)
        _stop(host.pid)
        store.add("n", 1)  # (on the successor, after FROZEN_S)
        assert succession.moves == 1 and store.where == f"127.0.0.1:{new}"
        assert moving.successor.add("n", 0) == 1
