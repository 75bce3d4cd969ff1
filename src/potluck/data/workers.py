"""Reading batches ahead in worker processes (``prepare(num_workers=K)``).

The step loader tells the pool, at each batch it hands out, which batches it expects
next (``Planned``: the next ``prefetch`` steps of this rank, as the cursor, the
membership and the shares stand). The pool's ``K`` processes read those while the
training process trains; a batch that was not read ahead, because the step was redone,
the membership changed or the shares moved, is read in the training process at once
(``fetch.read_batch``), and planned batches nobody expects any more are dropped. A
batch is named by its positions in the epoch, so what the loop gets is always the step
it asks for: exactly once holds whatever the pool guessed.

Each worker reads each sample under the sample's own seed (``fetch.seeded_read``), so
a batch is the same whether a worker or the training process read it (up to an
augmentation whose result depends on torch's thread count: workers use one thread).
Workers ignore Ctrl-C (the training process stops them) and end within a second of the
training process (``_watch``). ``close()``, and the interpreter's exit if nobody called
it, give the reads under way ``CLOSE_GRACE`` seconds (a worker stopped while it sends a
batch could leave the pool's result pipe half written, and the pool's thread blocked on
it), then terminate the workers still reading: a ``__getitem__`` that never returns
does not hold up the exit. ``read_timeout`` bounds the wait for a batch a worker reads
(``LoaderWorkerError``; None: as long as it takes). A dataset's error in a worker reaches
the loop as the same exception, with the worker's traceback and the samples it was
reading; a worker that dies (killed, out of memory) stops the loop with
``LoaderWorkerError``. Workers start by Python's default method (``fork`` on Linux
before Python 3.14): under ``spawn`` or ``forkserver`` the dataset and ``collate`` must
pickle.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures import TimeoutError as ReadTimeout  # (3.10: not the builtin)
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch

from potluck.data.fetch import BatchKey, Collate, Planned, read_batch, seeded_read
from potluck.errors import ConfigError, LoaderWorkerError

_SOURCE: tuple[Any, Collate] | None = None  # in a worker: what it reads from
CLOSE_GRACE = 5.0  # seconds the reads under way get at close() before their workers end

log = logging.getLogger(__name__)


class WorkerPool:
    """``workers`` processes reading planned batches (started at the first plan)."""

    def __init__(self, dataset: Any, collate: Collate, workers: int,
                 read_timeout: float | None = None) -> None:
        self._dataset, self._collate, self._workers = dataset, collate, workers
        self._read_timeout = read_timeout
        self._executor: ProcessPoolExecutor | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._reading: set[Future[Any]] = set()  # submitted, not done (dropped ones too)
        # (by key and seed: a cursor loaded with another seed reads other samples)
        self._pending: dict[tuple[BatchKey, int], Future[Any]] = {}
        self.hits = 0  # batches handed out that a worker had read ahead
        self.misses = 0  # and that were read here when asked for

    def get(self, wanted: Planned, ahead: Sequence[Planned]) -> Any:
        future = self._pending.pop((wanted.key, wanted.seed), None)
        try:
            self._plan(ahead)  # (first: the workers read on while this one is read or awaited)
            if future is None:
                self.misses += 1
                return read_batch(self._dataset, self._collate, wanted)
            self.hits += 1
            return future.result(timeout=self._read_timeout)
        except ReadTimeout as exc:
            self.close()
            raise LoaderWorkerError(
                f"a loader worker did not read the batch of samples {_shown(wanted.indices)} "
                f"within read_timeout={self._read_timeout:g} s: a dataset __getitem__ that "
                "hangs (a network file system, a lock held by a thread that did not fork "
                "along) or is that slow. The workers were stopped. Raise read_timeout (None "
                "waits as long as it takes), or pass num_workers=0 to read in the training "
                "process and see where it waits") from exc
        except BrokenProcessPool as exc:
            self.close()
            raise LoaderWorkerError(
                f"a loader worker process (num_workers={self._workers}) died, or what it "
                f"read could not be brought back ({exc}{_cause(exc)}), while the pool read "
                f"ahead (the batch of samples {_shown(wanted.indices)} was asked for): "
                "killed by a signal, most often the kernel's out-of-memory killer, or the "
                "dataset crashed in native code. Lower num_workers (each worker holds its "
                "batches in memory), or pass num_workers=0 to read in the training process "
                "and see the dataset's own error") from exc

    def close(self) -> None:
        """Stop the workers: batches planned and not yet read are dropped, the reads
        under way get ``CLOSE_GRACE`` seconds, and workers still reading then are
        terminated (``_stop``)."""
        executor, self._executor = self._executor, None
        self._pending.clear()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if executor is not None:
            _stop(executor, self._reading)

    def _plan(self, ahead: Sequence[Planned]) -> None:
        keys = {(planned.key, planned.seed) for planned in ahead}
        for key in [k for k in self._pending if k not in keys]:
            self._pending.pop(key).cancel()  # (one being read is read and dropped)
        for planned in ahead:
            if (planned.key, planned.seed) not in self._pending:
                self._pending[(planned.key, planned.seed)] = self._submit(planned)

    def _submit(self, planned: Planned) -> Future[Any]:
        """``planned``'s read, queued for a worker (the first submit starts them: under
        ``spawn`` or ``forkserver`` the dataset and collate are pickled then)."""
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                self._workers, mp_context=multiprocessing.get_context(),
                initializer=_start, initargs=(self._dataset, self._collate, os.getpid()))
            self._finalizer = weakref.finalize(self, _stop, self._executor, self._reading)
            _LIVE.add(self)
        try:
            future = self._executor.submit(_read, planned)
        except OSError as exc:  # (fork failed: out of processes or memory)
            self.close()
            raise ConfigError(f"num_workers={self._workers}: the loader's worker processes "
                              f"could not start ({exc}); lower num_workers, or pass "
                              "num_workers=0") from exc
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            self.close()
            raise ConfigError(
                f"num_workers={self._workers}: the loader's worker processes could not "
                f"start ({type(exc).__name__}: {exc}). Under Python's "
                f"{multiprocessing.get_start_method()!r} start method the dataset and "
                "collate= must pickle (no lambdas or local classes); or pass "
                "num_workers=0") from exc
        self._reading.add(future)
        future.add_done_callback(self._reading.discard)
        return future


def _stop(executor: ProcessPoolExecutor, reading: set[Future[Any]]) -> None:
    """Shut ``executor`` down: queued reads cancelled, the ones under way given
    ``CLOSE_GRACE`` seconds, the workers then terminated if any is still running (a
    read that long is stuck in the dataset, not sending its batch), and the pool shut
    down and joined (its thread ends once its workers have). The processes are read from
    a private attribute of ``ProcessPoolExecutor``, with a default: without it a stuck
    read would be waited for, as ``shutdown`` does."""
    for future in list(reading):
        future.cancel()  # (only a queued read: one a worker has taken runs on)
    _, stuck = wait(list(reading), timeout=CLOSE_GRACE)
    if stuck:
        log.warning("%d loader read(s) still under way %g s after the loader closed: their "
                    "worker processes are terminated (a dataset __getitem__ that hangs)",
                    len(stuck), CLOSE_GRACE)
        for process in list((getattr(executor, "_processes", None) or {}).values()):
            if process.is_alive():
                process.terminate()
    executor.shutdown(wait=True, cancel_futures=True)


_LIVE: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


def _close_live() -> None:
    """At the interpreter's exit, before ``concurrent.futures`` joins its pools (which
    would wait for a read that never ends): close the pools nobody closed."""
    for pool in list(_LIVE):
        pool.close()


# A forked worker inherits this hook (multiprocessing runs it at a worker's exit too)
# and a copy of the set, whose pools are its parent's: it starts with none.
os.register_at_fork(after_in_child=_LIVE.clear)


# Run before concurrent.futures' own exit hook, which joins every pool's thread (the
# threading module calls these hooks newest first, ahead of atexit's).
_at_exit = getattr(threading, "_register_atexit", None)
if _at_exit is not None:
    _at_exit(_close_live)


def _cause(exc: BaseException) -> str:
    """The remote traceback a broken pool carries, when it has one (a result that would
    not unpickle here), as its last line."""
    cause = str(exc.__cause__ or "").strip().splitlines()
    return f"; {cause[-1].strip()}" if cause else ""


def _start(dataset: Any, collate: Collate, trainer: int) -> None:
    """A worker's start: what it reads from, one torch thread, Ctrl-C left to the
    training process (``trainer``), and death with it within a second (``_watch``: not
    ``PR_SET_PDEATHSIG``, which fires when the thread that started the worker ends, and
    under a fork server names the server)."""
    global _SOURCE
    _SOURCE = (dataset, collate)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    threading.Thread(target=_watch, args=(trainer, _stat(trainer)),
                     name="potluck-loader-watch", daemon=True).start()


def _watch(trainer: int, born: list[str] | None, every: float = 1.0) -> None:
    """End this worker once the training process is gone (or a zombie nobody reaped
    yet, or its pid taken by a process started later). ``os._exit``, not an exception:
    nothing in this process may run on (the pool's queues would block on pipes whose
    other end died, and there is nobody left to read a batch)."""
    while _alive(trainer, born):
        time.sleep(every)
    os._exit(0)


def _alive(pid: int, born: list[str] | None) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # (another user's: the pid was reused)
        return False
    now = _stat(pid)
    if born is None or now is None:  # (no /proc: not Linux)
        return True
    return now[0] != "Z" and now[19] == born[19]  # (state; start time, in clock ticks)


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat``'s fields after the process's name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def _read(planned: Planned) -> Any:
    assert _SOURCE is not None, "a loader worker reads only after _start"
    dataset, collate = _SOURCE
    try:
        return seeded_read(dataset, collate, planned)
    except Exception as exc:
        if hasattr(exc, "add_note"):  # (Python 3.11: shown under the traceback)
            exc.add_note(f"(in potluck loader worker pid {os.getpid()}, reading dataset[i] "
                         f"for i in {_shown(planned.indices)})")
        raise


def _shown(indices: Sequence[int]) -> str:
    head = ", ".join(str(i) for i in indices[:6])
    return f"[{head}{', ...' if len(indices) > 6 else ''}] ({len(indices)} samples)"
