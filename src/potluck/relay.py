"""``RelayStore``: the job's store as a worker or agent holds it, one object between it
and c10d.

Every store call (the rendezvous, heartbeats, the failure watch, status pulses, the
process groups' own rendezvous, an agent's roll) goes through a relay to a ``TCPStore``
client. It is a ``torch.distributed.Store`` itself, so a process group is built on it as
on the client. A lost connection to the store (its host's process killed, its link
cut) is, where c10d raises a ``DistNetworkError`` from deep inside:

- with a ``Succession`` (a multi-node elastic job): the store moved to a successor
  (``succession.py``); the relay connects there and makes the call again;
- otherwise, or when no successor takes it: ``StoreLostError``, one line.

``clone()`` gives a relay on a new connection (the threads that poll keep their own),
and ``prefixed`` one under a prefix that stays clonable (c10d's ``PrefixStore.clone()``
cannot clone a store written in Python, so an ``EtcdStore`` takes the prefix itself).

Connections are few and made once. The store's server accepts on its one thread and
names each peer it accepts (a reverse lookup): a connection costs the whole job's store
that lookup. So a relay and the relays made from it share one c10d client for the
process groups (``for_c10d``), not one per generation, and one probe of the store's
host per process (``Succession.host_accepts``), not one per waiting thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store

from potluck.errors import StoreLostError
from potluck.etcd_store import EtcdStore
from potluck.succession import Succession

T = TypeVar("T")

SILENT_S = 2.0  # a store that can move and does not answer a quick call in this, and
#                whose host does not accept a connection either (``host_accepts``), is lost
FROZEN_S = 30.0  # one whose host accepts connections but that never answers: lost too
POLL_S = 0.01  # how often a wait for a key asks again
_ABSENT = "\x00potluck: no such key\x00"  # a value no key of potluck's holds
_JOIN_S = 0.05  # how often a waiting call looks whether the store moved meanwhile


class _Silent(Exception):
    """The store did not answer in time."""


class RelayStore(Store):
    """``inner``'s calls (the store at ``where``, under ``prefix``); a lost connection
    moves to the succession's next host, or is ``StoreLostError``."""

    def __init__(self, inner: Store, where: str, *, succession: Succession | None = None,
                 prefix: str = "", groups: GroupClient | None = None) -> None:
        """``groups``: the c10d client the process groups hold, shared with the relay
        this one is made from (None: this relay starts one)."""
        super().__init__()
        self._inner, self.where = inner, where
        self._succession, self._prefix = succession, prefix
        self._groups = groups if groups is not None else GroupClient()
        self._moving = threading.Lock()
        Store.set_timeout(self, getattr(inner, "timeout"))  # noqa: B009  (stubs lack it)

    def _call(self, what: str, call: Callable[[], T], *, blocking: bool = False) -> T:
        """``call`` on the store; ``blocking``: it may wait for a key (``get``,
        ``wait``), so no deadline but the store's own."""
        if self._succession is not None and self.where != self._succession.where:
            with self._moving:  # another relay of this process saw the store move:
                if self.where != self._succession.where:  # go there, not via a dead link
                    self._reconnect(self._succession)
        tried = self.where  # (where this call went: another thread may move the relay)
        try:
            return self._answered(call, blocking)
        except (dist.DistNetworkError, _Silent) as exc:
            cause = _first_line(exc)
            if self._succession is None:
                raise StoreLostError(self.where, what, cause) from None
        where = self._succession.moved(tried, what, cause)  # (or StoreLostError)
        with self._moving:
            if self.where != where:  # (the first of this relay's callers to get here)
                self._reconnect(self._succession)
        try:
            return self._answered(call, blocking)  # (a loop's read or write, again)
        except (dist.DistNetworkError, _Silent) as exc:
            raise StoreLostError(where, what, _first_line(exc), moved=True) from None

    def _reconnect(self, succession: Succession) -> None:
        """A new connection to where ``succession`` says the store is now. Every relay
        of a process shares one succession, so one that has not called since the store
        moved goes there at once, without first waiting out its dead connection
        (``SILENT_S`` on a cut link, relay after relay)."""
        where = succession.where
        client = succession.client()
        self._inner = PrefixStore(self._prefix, client) if self._prefix else client
        self.where = where

    def _answered(self, call: Callable[[], T], blocking: bool) -> T:
        """``call``'s answer. Where the store can move, a call that gets no answer in
        ``SILENT_S`` from a host that accepts no connection either (a cut link drops
        packets: c10d's client then waits on its socket for good), or none in
        ``FROZEN_S`` at all, is ``_Silent``: it runs on a thread of its own, left
        behind. So is one still waiting when another relay of this process moves the
        store."""
        succession = self._succession
        if succession is None or blocking:
            return call()
        answer: list[T] = []
        failure: list[BaseException] = []

        def run() -> None:
            try:
                answer.append(call())
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=run, name="potluck-store-call", daemon=True)
        thread.start()
        started = time.monotonic()
        deadline = started + SILENT_S
        while thread.is_alive():
            thread.join(_JOIN_S)
            if succession.where != self.where:
                raise _Silent(f"no answer, and the store moved to {succession.where}")
            if not thread.is_alive() or time.monotonic() < deadline:
                continue
            # A slow answer is not a lost store: on a busy machine a process may wait
            # seconds for a core. The host's kernel accepts a connection whatever its
            # processes do, so one that does not (a cut link, a host gone) is lost; one
            # that does is waited for, up to FROZEN_S (its store is frozen).
            waited = time.monotonic() - started
            if not succession.host_accepts(self.where):
                raise _Silent(f"no answer in {waited:.1f} s, and its host accepts no "
                              "connection (the link to it is cut?)")
            if waited >= FROZEN_S:
                raise _Silent(f"no answer in {waited:.1f} s, though its host accepts "
                              "connections (the store is frozen?)")
            deadline = time.monotonic() + SILENT_S
        if failure:
            raise failure[0]
        return answer[0]

    def set(self, key: str, value: str) -> None:
        if self._succession is None:
            self._call("set", lambda: self._inner.set(key, value))
            return
        # c10d's set gets no reply: one written into a dead host's socket is lost
        # without a word. Where the store can move, a check (answered) confirms it, and
        # a set the old host never confirmed is made again on the new one.
        self._call("set", lambda: self._confirmed_set(key, value))

    def _confirmed_set(self, key: str, value: str) -> None:
        self._inner.set(key, value)
        self._inner.check([key])

    def get(self, key: str) -> bytes:
        if self._succession is None:
            return self._call("get", lambda: self._inner.get(key), blocking=True)
        # No call that waits (c10d's get blocks while the key is absent, and a key may
        # go between a check and a get): a compare_set whose expected value no key holds
        # answers at once, the value where there is one, the sentinel where there is none.
        limit = getattr(self, "timeout").total_seconds()  # noqa: B009
        deadline = time.monotonic() + limit
        while True:
            value = self._call("get", lambda: self._inner.compare_set(key, _ABSENT, _ABSENT))
            if value != _ABSENT.encode():
                return value
            if time.monotonic() > deadline:
                raise dist.DistStoreError(f"waited {limit:g} s for key {key!r} on the store "
                                          f"at {self.where}; it never came")
            time.sleep(POLL_S)

    def add(self, key: str, amount: int) -> int:
        return self._call("add", lambda: self._inner.add(key, amount))

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return self._call("compare_set", lambda: self._inner.compare_set(key, expected, desired))

    def check(self, keys: list[str]) -> bool:
        return self._call("check", lambda: self._inner.check(keys))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if self._succession is not None:
            self._until(keys, timeout, f"keys {keys}")
            return
        if timeout is None:
            self._call("wait", lambda: self._inner.wait(keys), blocking=True)
        else:
            self._call("wait", lambda: self._inner.wait(keys, timeout), blocking=True)

    def _until(self, keys: list[str], timeout: timedelta | None, what: str) -> None:
        """Wait for ``keys`` by asking ``check`` every ``POLL_S``: c10d's own waits get
        no deadline of ours, and on a cut link they never return (a call that gets no
        answer must move the store, not hang its caller)."""
        limit = (timeout or getattr(self, "timeout")).total_seconds()  # noqa: B009
        deadline = time.monotonic() + limit
        while not self.check(keys):
            if time.monotonic() > deadline:
                raise dist.DistStoreError(f"waited {limit:g} s for {what} on the store at "
                                          f"{self.where}; it never came")
            time.sleep(POLL_S)

    def delete_key(self, key: str) -> bool:
        return self._call("delete_key", lambda: self._inner.delete_key(key))

    def num_keys(self) -> int:
        return self._call("num_keys", lambda: self._inner.num_keys())

    def list_keys(self) -> list[str]:
        return self._call("list_keys", lambda: self._inner.list_keys())

    def clone(self) -> RelayStore:
        """A relay on a new connection to the same store."""
        inner = self._call("connect", lambda: getattr(self._inner, "clone")())  # noqa: B009
        return RelayStore(inner, self.where, succession=self._succession, prefix=self._prefix,
                          groups=self._groups)


class GroupClient:
    """The one c10d client of the store that every process group of a process holds,
    made at the first group and again only where the store moved. A group per
    generation on a connection of its own made every member's connection a new one at
    every join and loss."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Store | None = None
        self._where = ""

    def get(self, where: str, connect: Callable[[], Store]) -> Store:
        """The client of the store at ``where``; ``connect`` makes it if there is none."""
        with self._lock:
            if self._client is None or self._where != where:
                self._client, self._where = connect(), where
            return self._client


def for_c10d(store: Store) -> Store:
    """A store c10d's own C++ code may hold (a process group's rendezvous, NCCL's lazy
    init on its threads): for a relay, the process's one c10d client of the store where
    it is now (``GroupClient``), not the relay (a store written in Python needs the GIL
    on every call, the deadlock class of pytorch/pytorch#104103); any other store as
    it is. A relay over etcd gives
    its own ``EtcdStore``: no client of etcd is native, and a Python store that only
    C++ holds loses its methods (pybind keeps no Python object alive for it), so the
    relay, which the cohort holds, keeps it alive."""
    if not isinstance(store, RelayStore):
        return store
    if isinstance(store._inner, EtcdStore):
        return store._inner
    base = _unprefixed(store._inner)
    client = store._groups.get(
        store.where, lambda: store._call("connect", lambda: getattr(base, "clone")()))  # noqa: B009
    return PrefixStore(store._prefix, client) if store._prefix else client


def succession_of(store: Store) -> Succession | None:
    """The succession a relay moves with (None: not a relay, or it has none)."""
    return store._succession if isinstance(store, RelayStore) else None


def prefixed(store: Store, prefix: str) -> Store:
    """``store``'s keys under ``prefix``: a ``PrefixStore``, or for a relay a relay over
    one (it stays clonable, and moves with the store)."""
    if isinstance(store, RelayStore):
        # PrefixStore(p, PrefixStore(q, s)) keys "q/p/key": the same as one of "q/p"
        whole = f"{store._prefix}/{prefix}" if store._prefix else prefix
        return RelayStore(_under(store._inner, prefix), store.where,
                          succession=store._succession, prefix=whole, groups=store._groups)
    return _under(store, prefix)


def _unprefixed(store: Store) -> Store:
    """The store a chain of ``PrefixStore`` wraps."""
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    return store


def _under(store: Store, prefix: str) -> Store:
    """c10d's ``PrefixStore``; for an etcd store one of its own, which clones."""
    return store.under(prefix) if isinstance(store, EtcdStore) else PrefixStore(prefix, store)


def _first_line(exc: BaseException) -> str:
    """c10d's message without the C++ stack trace it may carry."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
