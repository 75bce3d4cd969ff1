"""``FailureWatch``: "a member gave up on this generation's step", told through the store.

A ring all-reduce can leave a survivor waiting for data from another survivor that has
already abandoned the step (its own link to the dead worker failed first); Gloo would
keep it waiting for its whole collective timeout. The member that abandons marks the
generation failed in the store; a daemon thread, on a store connection of its own, polls
for that mark, so the reducer's wait can ask ``seen()`` without any I/O and give up at
once. A thread, not a check from the waiting thread: over a dead link a store request
blocks for minutes, and the collective timeout must stay the bound. The thread polls
only while this member waits in a collective: a new wait wakes it at once.

A peer that froze (SIGSTOP, a hung driver) abandons nothing: everyone would wait for it
until the collective timeout. So the thread also reads the heartbeat of one peer, the
next member in the generation (each member watches one, so the store sees one read per
member, not one per pair), and marks the generation failed once that beat is older than
the heartbeat timeout while this member has been waiting in the step's collectives for
longer than that too: the step is redone without the frozen member within seconds. A
beat that is late while nobody waits (a starved heartbeat thread) changes nothing. A
peer with no beat at all beat once (to be admitted) on a store that has since moved
(``potluck.succession``): it is as silent as the time its beat has been missing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from torch._C._distributed_c10d import Store

from potluck.relay import prefixed
from potluck.rendezvous.heartbeat import read_beats

log = logging.getLogger(__name__)

_PEER_CHECK = 0.5  # seconds between reads of the watched peer's heartbeat
_SAME_WAIT = 0.5  # waits asked about within this many seconds of each other are one
_IDLE = 1.0  # while this member waits for nothing, the thread sleeps (a wait wakes it)


class FailureWatch:
    """Marks and watches ``key(generation)`` (``keys.step_failed``); ``stop()`` ends the
    thread."""

    def __init__(self, store: Store, key: Callable[[int], str], generation: Callable[[], int],
                 *, interval: float = 0.05, peer: Callable[[], str | None] = lambda: None,
                 heartbeat_timeout: float = float("inf"), beats_prefix: str = "") -> None:
        # Two connections of their own: the thread's poll may be stuck on a dead link,
        # and a request on a connection waits for the one in flight.
        self._store: Store = getattr(store, "clone")()  # noqa: B009  (stubs lack clone)
        self._marker: Store = getattr(store, "clone")()  # noqa: B009
        self._key, self._generation, self._interval = key, generation, interval
        self._peer, self._heartbeat_timeout = peer, heartbeat_timeout
        # The rendezvous keeps its heartbeats under its own prefix.
        self._beats: Store = prefixed(self._store, beats_prefix) if beats_prefix \
            else self._store
        self._next_peer_check = 0.0
        self._missing_since: dict[str, float] = {}  # a peer with no beat: since when
        self._waiting_since = self._last_asked = -float("inf")
        self._seen: set[int] = set()
        self._stop = threading.Event()
        self._wake = threading.Event()  # a wait began
        self._thread = threading.Thread(target=self._run, name="potluck-failure-watch",
                                        daemon=True)
        self._thread.start()

    def mark(self, generation: int) -> None:
        """This member abandoned ``generation``'s step (``set`` needs no reply: never
        blocks on a dead link)."""
        self._seen.add(generation)
        with contextlib.suppress(RuntimeError):
            self._marker.set(self._key(generation), "1")

    def seen(self, generation: int) -> bool:
        """Asked (every few ms) by a member waiting for a collective of ``generation``."""
        now = time.monotonic()
        if now - self._last_asked > _SAME_WAIT:
            self._waiting_since = now  # a new wait began
            self._wake.set()
        self._last_asked = now
        return generation in self._seen

    def _waited(self) -> float:
        """How long this member has been waiting in collectives without a break (0:
        not waiting now)."""
        now = time.monotonic()
        return 0.0 if now - self._last_asked > _SAME_WAIT else now - self._waiting_since

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            if time.monotonic() - self._last_asked <= _SAME_WAIT:  # (a member waiting
                # in a collective needs the news)
                self._stop.wait(self._interval)
            else:  # nobody asks: no request to the store (32 members polling every 50
                self._wake.wait(_IDLE)  # ms were 640 requests a second)
                self._wake.clear()
            if self._stop.is_set():
                return
            generation = self._generation()
            if generation in self._seen:
                continue
            try:
                if self._store.check([self._key(generation)]):
                    self._seen.add(generation)
                elif self._peer_is_stale():
                    self.mark(generation)
            except RuntimeError:  # the store is gone: the rendezvous reports it
                return

    def _peer_is_stale(self) -> bool:
        now = time.monotonic()
        if now < self._next_peer_check or self._waited() <= self._heartbeat_timeout:
            return False
        self._next_peer_check = now + _PEER_CHECK
        peer = self._peer()
        if peer is None:
            return False
        beat = read_beats(self._beats, [peer]).get(peer)
        if beat is None:  # every member beat to be admitted: the store moved since
            silent = now - self._missing_since.setdefault(peer, now)
        else:
            self._missing_since.pop(peer, None)
            silent = time.time() - beat
        if silent <= self._heartbeat_timeout:
            return False
        log.warning("member %s sent no heartbeat for %.1f s: abandoning this generation's "
                    "step so that the others go on without it", peer, silent)
        return True
