"""Where the job's store is, and where it goes when its host is lost.

The store lives with node 0's agent. So that a cohort outlives that host, every agent of
a multi-node elastic job holds a *successor* socket from its start: bound and listening,
its address published on the store (``publish``). Workers and agents read the list
while the store lives (``Succession.learn``). When the store's host is lost (a broken
connection, ``RelayStore``), every survivor computes the same next host: the first
candidate in node order, other than the lost host's node, whose socket accepts a
connection (``successors``, pure; ``reachable``). Every surviving agent serves a store
on its own socket as soon as it sees the loss, so whichever is first is ready; the
survivors connect there and each writes back what it holds (``seeders``: the
generation's record, its heartbeat, the agents' roll), and the cohort goes on.

A side of a partition that cannot reach the first candidate picks another one, but the
cohort's next generation needs a majority of the last one (``rendezvous.state``), so two
sides never both go on.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from potluck import keys
from potluck.errors import StoreLostError

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

log = logging.getLogger(__name__)

PROBE_S = 1.0  # a socket that does not accept a connection within this is not reachable
# A probe that found the store's host accepting answers for the whole process this long:
# each probe is a connection the store's one thread accepts and names (a reverse lookup).
ACCEPTED_S = 10.0
CONNECT_S = 30.0  # for the chosen host's agent to see the loss and serve


@dataclass(frozen=True, order=True)
class Candidate:
    """A host that can take the store: node ``node``'s agent, listening at host:port."""

    node: int
    host: str
    port: int

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    def encode(self) -> str:
        return f"{self.node} {self.host} {self.port}"

    @classmethod
    def decode(cls, raw: str) -> Candidate:
        node, host, port = raw.split()
        return cls(int(node), host, int(port))


def successors(candidates: Sequence[Candidate], lost_node: int) -> list[Candidate]:
    """The order in which survivors try the candidates when ``lost_node``'s store is
    lost: node order, without that node (pure)."""
    return sorted(c for c in set(candidates) if c.node != lost_node)


def reachable(candidate: Candidate, timeout: float = PROBE_S) -> bool:
    """Whether the candidate's socket accepts a connection (its agent lives, and the
    link to it works)."""
    try:
        with socket.create_connection((candidate.host, candidate.port), timeout=timeout):
            return True
    except OSError:
        return False


def publish(store: Store, run_id: str, candidate: Candidate) -> None:
    """An agent's successor socket, on the store (every worker and agent reads them)."""
    slot = int(store.add(keys.successor_count(run_id), 1)) - 1
    store.set(keys.successor(run_id, slot), candidate.encode())


def read(store: Store, run_id: str, first: int = 0) -> tuple[list[Candidate], int]:
    """The candidates published from slot ``first`` on, in node order, and the slot to
    read from next time: a published slot never changes, so a reader reads each once.
    (A slot counted but not yet written stops the count there: it is read next time.)"""
    count = int(store.add(keys.successor_count(run_id), 0))
    found, upto = [], count
    for slot in range(first, count):
        key = keys.successor(run_id, slot)
        if store.check([key]):
            found.append(Candidate.decode(store.get(key).decode()))
        else:
            upto = min(upto, slot)
    return sorted(set(found)), upto


Connect = Callable[[Candidate], "Store"]  # a client of the store a candidate serves


class Succession:
    """One process's view of where the store is: the host (``node``, ``where``), the
    candidates learned, and what to write back on a new store. Shared by every relay
    of the process, whatever thread calls."""

    def __init__(self, run_id: str, where: str, node: int = 0, *,
                 connect: Connect | None = None,
                 serve: Callable[[], None] | None = None) -> None:
        """``where``: the store's address now, hosted by ``node``'s agent. ``serve``: an
        agent's, called first on a loss (it starts the store on its own socket)."""
        self.run_id, self.where, self.node = run_id, where, node
        self._connect = connect or _client
        self._serve = serve
        self._candidates: list[Candidate] = []
        self._learned = (where, 0)  # the store read from, and the next slot to read
        self._root: Store | None = None
        self._seeders: list[Callable[[Store], None]] = []
        self._lock = threading.RLock()
        self._probing = threading.Lock()
        self._accepted: dict[str, float] = {}  # where -> when a probe was last accepted
        self.moves = 0  # how many times the store moved
        self.moving = False  # a thread of this process is moving the store now
        self.moved_at = -float("inf")  # when the last move ended (monotonic)
        self.lost: frozenset[int] = frozenset()  # nodes whose store was lost

    def use(self, root: Store) -> None:
        """The process's own relay of the whole store (``learn`` reads through it: a
        relay's calls have deadlines, and move with the store)."""
        self._root = root

    def learn(self, store: Store | None = None) -> None:
        """Read the candidates from ``store`` (the job's, unprefixed; None: the relay
        given to ``use``), while it lives: only those published since the last read
        (an agent learns every second, and every node of a long run published one). A
        store already lost teaches nothing."""
        source = store if store is not None else self._root
        if source is None:
            return
        where, first = self._learned
        if where != self.where:  # the store moved: its list starts anew
            where, first = self.where, 0
        try:
            found, upto = read(source, self.run_id, first)
        except RuntimeError as exc:  # (StoreLostError too: the relay said it)
            log.debug("could not read the store's successors: %s", exc)
            return
        known = self._candidates if first else []
        self._candidates = sorted(set(known) | set(found))
        self._learned = (where, upto)

    @property
    def candidates(self) -> list[Candidate]:
        return list(self._candidates)

    def host_accepts(self, where: str) -> bool:
        """Whether the store's socket at ``where`` (host:port) accepts a connection.
        One probe at a time for the whole process, and none for ``ACCEPTED_S`` after one
        was accepted: every thread of every process waiting on a slow store once probed
        it every 2 s, and each probe cost the store's thread a reverse lookup."""
        with self._probing:
            if time.monotonic() - self._accepted.get(where, -ACCEPTED_S) < ACCEPTED_S:
                return True
            host, port = where.rsplit(":", 1)
            if not reachable(Candidate(-1, host.strip("[]"), int(port))):
                return False
            self._accepted[where] = time.monotonic()
            return True

    def seeder(self, seed: Callable[[Store], None]) -> None:
        """``seed(store)`` writes back what this process holds, on every new store."""
        with self._lock:
            self._seeders.append(seed)

    def client(self) -> Store:
        """A new connection to the store where it is now."""
        host, port = self.where.rsplit(":", 1)
        return self._connect(Candidate(self.node, host, int(port)))

    def moved(self, lost: str, what: str, cause: str) -> str:
        """The store at ``lost`` is gone: where it is now (``lost`` if no candidate
        takes it: ``StoreLostError``). Every caller after the first finds it moved."""
        with self._lock:
            if self.where != lost:
                return self.where
            self.moving = True
            try:
                return self._move(lost, what, cause)
            finally:
                self.moving = False

    def _move(self, lost: str, what: str, cause: str) -> str:
        """``moved``'s work, under its lock."""
        if self._serve is not None:
            self._serve()
        for candidate in successors(self._candidates, self.node):
            if not reachable(candidate):
                continue
            try:
                store = self._connect(candidate)
            except RuntimeError as exc:
                log.warning("the store's successor on node %d (%s) did not answer: %s",
                            candidate.node, candidate.where, exc)
                continue
            self.lost |= {self.node}
            self.where, self.node = candidate.where, candidate.node
            self.moves += 1
            log.warning("the job's store at %s is gone (%s: %s): it moved to node %d "
                        "at %s", lost, what, cause, candidate.node, candidate.where)
            for seed in self._seeders:
                try:
                    seed(store)
                except RuntimeError as exc:  # (one writer's failure is not the move's)
                    log.warning("could not write back to the moved store: %s", exc)
            self.moved_at = time.monotonic()
            return self.where
        raise StoreLostError(lost, what, cause, tried=[c.where for c in successors(
            self._candidates, self.node)])


def _client(candidate: Candidate) -> Store:
    from torch._C._distributed_c10d import TCPStore

    return TCPStore(candidate.host, candidate.port, is_master=False,
                    timeout=timedelta(seconds=CONNECT_S))
