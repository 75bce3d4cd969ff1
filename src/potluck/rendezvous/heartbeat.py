"""Heartbeats: a daemon thread that says "still here", and a reader that judges freshness.

The writer puts ``hb/<id> = <wall-clock seconds>`` every ``interval`` seconds, never back
in time (``write_beat``), on its own store connection (a ``clone()`` of the caller's
store: a c10d client must not be shared across threads). A worker that dies or is
frozen (SIGSTOP) stops writing, so its last beat ages past ``timeout`` and it counts as
gone. The reader compares a beat with its own wall clock: clocks of different hosts
must agree to well within ``timeout`` (NTP does), which is why the timeout is seconds,
not milliseconds.

A beat that fails is not the end of the heartbeat. Store errors (``RuntimeError``:
c10d's store and network errors, potluck's ``StoreLostError``; ``OSError``) are
transient: the writer warns once, takes a new connection and beats again every
``interval``, and says when a beat gets through again. It gives up only after
``patience`` seconds without a beat that got through (default 120 s, longer than any
rendezvous waits): by then every member has counted this one gone. Any other error is
a bug and ends the thread with its traceback.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from torch._C._distributed_c10d import Store

from potluck import keys
from potluck.errors import ConfigError

log = logging.getLogger(__name__)

# Seconds without a beat that got through before the writer gives up: past any wait of
# the rendezvous (settle_timeout + heartbeat_timeout), so the member is out by then.
PATIENCE = 120.0
# Compare-and-sets a beat tries (one, or two or three after the store moved) before it
# counts as failed (the heartbeat then retries on a new connection).
_WRITES = 8


def fresh(now: float, beats: Mapping[str, float], timeout: float) -> set[str]:
    """Workers whose last beat is at most ``timeout`` seconds old at ``now``."""
    return {worker for worker, last in beats.items() if now - last <= timeout}


def write_beat(store: Store, worker: str, now: float, last: str = "") -> str:
    """Put ``worker``'s beat ``now`` on ``store``, never over a later one; the value the
    store holds after (answered: the store heard it). ``last``: the value this writer
    put last, what the store likely holds.

    A beat is a compare-and-set, not a ``set``: a beat held up on a store that then
    moved is made again on the new one by the relay (``potluck.relay``), after the
    move wrote back a later beat of the same worker; a ``set`` would put the old time
    back over it, and for a beat's interval the others would read the worker as
    seconds gone (a cut-off store host's survivor was left out so)."""
    key, mine = keys.heartbeat(worker), f"{now:.6f}"
    expected = "" if last == mine else last  # (an echo of it would read as written)
    for _ in range(_WRITES):
        have = store.compare_set(key, expected, mine).decode()
        if have == mine or (have and have != expected and float(have) >= now):
            return have
        # an older beat: over it next; none (a store answers the expected value for a
        # key it does not hold): create it
        expected = "" if have == expected else have
    raise RuntimeError(f"heartbeat of {worker}: the store's key {key} changed under each "
                       f"of {_WRITES} writes")


def read_beats(store: Store, workers: Iterable[str]) -> dict[str, float]:
    """The last beat of each worker that ever beat (a worker that never did is absent)."""
    beats: dict[str, float] = {}
    for worker in workers:
        key = keys.heartbeat(worker)
        if store.check([key]):
            beats[worker] = float(store.get(key).decode())
    return beats


class Heartbeat:
    """Beats for ``worker_id`` every ``interval`` s on a thread of its own until ``stop()``."""

    def __init__(
        self,
        store: Store,
        worker_id: str,
        interval: float,
        *,
        clock: Callable[[], float] = time.time,
        patience: float = PATIENCE,
    ) -> None:
        if not interval > 0:
            raise ConfigError(f"heartbeat interval={interval!r} must be > 0 seconds, e.g. 1.0")
        self.worker_id = worker_id
        self.interval, self.patience = interval, patience
        self._clock = clock
        # This thread's own connection (torch's stubs lack ``Store.clone``).
        self._store: Store = getattr(store, "clone")()  # noqa: B009
        self._stop = threading.Event()
        self.last_ok = time.monotonic()  # when a beat last reached the store
        self._last = ""  # the value of this writer's last beat on the store
        self._thread = threading.Thread(
            target=self._run, name=f"potluck-heartbeat-{worker_id}", daemon=True
        )

    def start(self) -> Heartbeat:
        self.beat()  # the first beat is synchronous: fresh from the moment start() returns
        self._thread.start()
        return self

    def beat(self) -> None:
        # (answered: a ``set`` gets no reply, it "succeeds" into a dead link's buffer)
        self._last = write_beat(self._store, self.worker_id, self._clock(), self._last)
        self.last_ok = time.monotonic()

    def stop(self) -> None:
        """Stop beating (the last beat then ages); safe to call twice."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(1.0, 2 * self.interval))

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        failing = False  # the last beat failed: say so once, and again when one gets through
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except (RuntimeError, OSError) as exc:  # the store's: transient (see above)
                silent = time.monotonic() - self.last_ok
                if silent > self.patience:
                    log.error("heartbeat of %s stopped: no beat got through for %.0f s "
                              "(patience %g s): %s", self.worker_id, silent, self.patience,
                              exc)
                    return
                if not failing:
                    log.warning("a heartbeat of %s failed (%s): trying again every %g s "
                                "on a new connection", self.worker_id, exc, self.interval)
                failing = True
                self._reconnect()
                continue
            if failing:
                log.warning("heartbeat of %s got through again", self.worker_id)
                failing = False

    def _reconnect(self) -> None:
        """A new connection for the next beat (a broken one may never answer again)."""
        # (unreachable now: the next beat tries the old connection again)
        with contextlib.suppress(RuntimeError, OSError):
            self._store = getattr(self._store, "clone")()  # noqa: B009
