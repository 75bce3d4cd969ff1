"""Where a worker's step figures go: its ``rank_step`` journal, and pulses on the store.

``StorePublisher`` is what the launcher's status page reads (``potluck.status.board``).
A daemon thread sets this worker's pulse key every ``interval`` seconds: where the rank
is now (``observer.describe``), its rank, generation, every step since its previous
pulse and 64 before them (a poller that missed a pulse finds them in the next), its
membership events and notes. The thread keeps
pulsing while the training thread is blocked in a collective, so a rank whose pulses
stop is stopped, dead or cut off, not merely waiting; that is how the page names a
frozen rank. The thread has its own store connection; a store that went away (the run
ended) ends the thread quietly. Its connection may be a relay that follows the store to
another node (``potluck.succession``): the thread then registers this worker there again.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from torch._C._distributed_c10d import Store, TCPStore

from potluck import keys
from potluck.events import Note
from potluck.metrics.journal import Journal
from potluck.metrics.observer import Position, StepFigures, Where, describe
from potluck.relay import succession_of

log = logging.getLogger(__name__)

# Every pulse carries the steps since the previous pulse and this many before them, so a
# pulse the poller missed costs nothing; at most KEPT_STEPS (steps of about 1 ms make
# 500 between two pulses: the board judges a step only once every member's is in).
RECENT_STEPS = 64
KEPT_STEPS = 2048
MAX_EVENTS_PER_PULSE = 20  # membership events, and notes


class JournalSink:
    """Appends each step as a ``rank_step`` record to ``<directory>/ranks/rank-<pid>.jsonl``."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / "ranks" / f"rank-{os.getpid()}.jsonl"
        self._journal = Journal(self.path)
        self._lock = threading.Lock()  # notes come from other threads (a checkpoint's)
        self._closed = False

    def write(self, figures: StepFigures) -> None:
        self._append("rank_step", figures.record())

    def note(self, note: Note) -> None:
        self._append("event", note.record())

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._journal.close()

    def _append(self, kind: str, fields: dict[str, Any]) -> None:
        with self._lock:
            if not self._closed:  # a note racing the run's end is dropped, not an error
                self._journal.write(kind, **fields)


def store_client(host: str, port: int, timeout: float = 10.0) -> Callable[[], Store]:
    """A factory of a fresh client connection to the job's store."""
    return lambda: TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout))


class StorePublisher:
    """Pulses this worker's position and new steps onto the store (a daemon thread)."""

    def __init__(self, connect: Callable[[], Store], run_id: str, worker: str, *,
                 position: Callable[[], Position], where: Where,
                 events: Callable[[], list[dict[str, Any]]] = list,
                 member: str | None = None, attempt: int = 0,
                 counts_samples: bool = True, interval: float = 0.5) -> None:
        """``member``: this worker's id in the cohort (trust notes name it); ``attempt``:
        the launcher's restart of a fixed job (its workers all start again);
        ``counts_samples``: False when the steps carry no samples (a script without
        ``potluck.prepare``), so the page says why samples/s is blank."""
        self._connect, self._run_id, self._worker = connect, run_id, worker
        self._position, self._where, self._events = position, where, events
        self._member, self._attempt = member, attempt
        self._counts_samples = counts_samples
        self._interval = interval
        self._lock = threading.Lock()
        self._recent: deque[dict[str, Any]] = deque(maxlen=KEPT_STEPS)
        self._new = 0  # steps written since the last pulse
        self._notes: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS_PER_PULSE)
        self._stop = threading.Event()
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name="potluck-status",
                                         daemon=True)

    def start(self) -> StorePublisher:
        self._thread.start()
        return self

    def write(self, figures: StepFigures) -> None:
        with self._lock:
            self._recent.append(figures.record())
            self._new += 1

    def note(self, note: Note) -> None:
        with self._lock:
            self._notes.append({**note.record(), "time": time.time()})

    def close(self) -> None:
        """Send the last steps (marked done) and end the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def pulse(self, *, done: bool = False) -> dict[str, Any]:
        """The next pulse's content: where the worker is, its last steps (a poller that
        missed a pulse gets them from the next; the board files them by step)."""
        with self._lock:
            count = min(len(self._recent), self._new + RECENT_STEPS)
            steps = list(itertools.islice(self._recent, len(self._recent) - count, None))
            notes, self._new = list(self._notes), 0
        rank, world_size, generation = self._where()
        position = self._position()
        self._seq += 1
        return {"seq": self._seq, "worker": self._worker, "pid": os.getpid(),
                "member": self._member, "attempt": self._attempt,
                "counts_samples": self._counts_samples,
                "rank": rank, "world_size": world_size, "generation": generation,
                "phase": describe(position), "phase_s": time.perf_counter() - position.since,
                "steps": steps, "events": self._events()[-MAX_EVENTS_PER_PULSE:],
                "notes": notes, "done": done}

    def _run(self) -> None:
        try:
            store = self._connect()
            succession = succession_of(store)
            key, moves = keys.status_pulse(self._run_id, self._worker), -1
            while True:
                # A store that moved to another node starts without this worker's slot:
                # it is written again there, so the page the new host serves lists it.
                if moves != (succession.moves if succession is not None else 0):
                    moves = succession.moves if succession is not None else 0
                    slot = int(store.add(keys.status_count(self._run_id), 1)) - 1
                    store.set(keys.status_slot(self._run_id, slot), self._worker)
                if self._stop.wait(self._interval):
                    break
                store.set(key, json.dumps(self.pulse()))
            store.set(key, json.dumps(self.pulse(done=True)))
        except Exception as exc:  # the store is gone (the run ended): nothing to tell
            log.debug("status pulses stopped: %s", exc)


class ScalarWriter(Protocol):
    """What ``torch.utils.tensorboard.SummaryWriter`` offers that the sink uses."""

    def add_scalar(self, tag: str, value: float, step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """Each step's figures as TensorBoard scalars (``rank<r>/compute_s`` ...), through
    the standard ``SummaryWriter``; ``tensorboard_sink`` makes one when it is installed."""

    FIELDS = ("compute_s", "wait_s", "comm_s", "step_s", "samples_per_s", "share", "loss")

    def __init__(self, writer: ScalarWriter) -> None:
        self._writer = writer

    def write(self, figures: StepFigures) -> None:
        record = figures.record()
        for name in self.FIELDS:
            if record.get(name) is not None:
                self._writer.add_scalar(f"rank{figures.rank}/{name}", record[name],
                                        figures.step)

    def note(self, note: Note) -> None:
        """Notes are in the journal and on the page; TensorBoard gets the scalars only."""

    def close(self) -> None:
        self._writer.close()


def tensorboard_sink(directory: str | Path) -> TensorBoardSink | None:
    """A sink writing under ``<directory>/tensorboard/<pid>``, or None when TensorBoard
    is not installed (``pip install tensorboard``)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return TensorBoardSink(SummaryWriter(str(Path(directory) / "tensorboard" / str(os.getpid()))))
