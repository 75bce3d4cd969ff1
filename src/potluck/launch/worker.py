"""Worker bootstrap: ``python -m potluck.launch.worker [-m] script.py [args...]``.

Runs the user's script as ``__main__`` (``sys.argv`` as if it were started directly) and,
on an uncaught exception, writes it to the error file the launcher named before the
usual traceback goes to stderr, so the launcher's report can quote it. An elastic cohort
that stopped below its minimum size (``BelowMinimumError``) is a planned stop: its
message, no traceback, a stop file beside the finished file, and exit code 3; the
launcher does not restart it (a script's own ``sys.exit(3)`` writes no stop file, and
is a failure like any other: a non-zero ``SystemExit`` goes to the error file, so the
report says the script exited with that code). A joiner
that arrived after the run finished (``JobFinishedError``) says so and exits with 0.
A script that ran to its end (or called ``sys.exit(0)``) is recorded in the finished file
the launcher named, so that a crash while the interpreter shuts down afterwards is
reported as that, and never restarts a completed training. It also asks the kernel to
kill this worker if the launcher dies, so no worker outlives its agent. An uncaught
potluck error (``report.brief_error``) prints one line, not its traceback.

With ``--status-port`` or ``--metrics-dir`` the bootstrap watches for a
``potluck.DataParallel`` the script builds itself (``metrics.plain``): a script without
``potluck.prepare`` then shows its step times, though not its samples. ``--balance``
takes effect in ``potluck.prepare`` only, and a torch DDP model reports nothing. What a
flag does not do for this script, rank 0 says once (``UnusedFlags``), after
``UNUSED_AFTER`` seconds or at the script's end.

A warm spare (``POTLUCK_STANDBY_FD`` set: the agent of an elastic job starts one ahead
of a restart) first imports what every worker imports, at the lowest CPU priority (its
own and its session's autogroup's, see ``priority``), then
waits on that pipe for the environment of the worker it replaces, and only then runs
the script; the agent closing the pipe unused sends it away.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import runpy
import signal
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from potluck import env
from potluck.errors import (
    BelowMinimumError,
    ConfigError,
    JobFinishedError,
    RendezvousError,
    hint,
)
from potluck.launch import priority
from potluck.launch.report import (
    brief_error,
    write_error_file,
    write_finished_file,
    write_stop_file,
)

if TYPE_CHECKING:
    from potluck.metrics.plain import PlainModels

_PR_SET_PDEATHSIG = 1


def die_with_agent() -> None:
    agent = env.agent_pid()
    if agent is None or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != agent:  # the agent died before prctl took effect
        os._exit(1)


def main(argv: list[str]) -> None:
    module = bool(argv) and argv[0] == "-m"
    if module:
        argv = argv[1:]
    if not argv:
        sys.exit("usage: python -m potluck.launch.worker [-m] script.py [args...]")
    die_with_agent()
    if not _wait_as_spare():
        return  # not needed after all
    plain = _watch_plain_models()
    flags = UnusedFlags.for_this_worker(plain)
    target = argv[0]
    sys.argv = list(argv)
    if not module:
        sys.path[0] = os.path.dirname(os.path.abspath(target))
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or exc.code == 0:
            _record_finished(flags, plain)
        else:  # the report says how it ended: not "died without raising"
            _record_error(exc)
        raise
    except KeyboardInterrupt:
        raise
    except BelowMinimumError as exc:  # a planned stop, not a crash: no traceback
        path = env.finished_file()
        if path is not None:  # what tells the launcher, not the exit code alone
            write_stop_file(path)
        _planned_exit(str(exc), BelowMinimumError.EXIT_CODE)
    except JobFinishedError as exc:  # came too late to help: nothing failed
        _planned_exit(str(exc), 0)
    except RendezvousError as exc:  # not admitted, no cohort, no store: the message is
        path = env.error_file()  # what to fix; potluck's frames would only bury it
        if path is not None:
            write_error_file(path, exc.with_traceback(None))
        _planned_exit(f"{type(exc).__name__}: {exc}", 1)
    except BaseException as exc:
        note = hint(exc)  # torch's error on a potluck object: what to do instead
        if note is not None:
            exc.add_note(note)
        _record_error(exc)
        if brief_error(exc):  # potluck's own: its message is what to fix, in one line
            print(f"potluck: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        else:
            # Printed here, through whatever hook the script installed, starting in the
            # script: re-raised, it would gain this bootstrap's and runpy's frames again.
            sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)  # what an uncaught exception exits with
    _record_finished(flags, plain)


def _wait_as_spare() -> bool:
    """A spare: warm up, wait for the environment of the worker it becomes, take it on.
    False when the agent closed the pipe without one. Not a spare: True at once.

    The pipe is read by a thread while the main thread warms up, so that a spare taken
    before it is warm gets its priority back at once instead of finishing at nice 19."""
    fd = env.standby_fd()
    if fd is None:
        return True
    nice = priority.lower()
    group_nice = priority.lower_autogroup()
    received: list[bytes] = []
    listener = threading.Thread(target=_listen, args=(fd, nice, group_nice, received),
                                daemon=True)
    listener.start()
    warm_up()
    listener.join()
    if not received or not received[0]:
        return False
    if nice is not None:  # again: a thread the warm-up started after the listener's walk
        with contextlib.suppress(PermissionError):  # (the listener said so already)
            priority.restore(nice)
    # The bootstrap's own process becomes the worker: its environment is the worker's.
    os.environ.clear()
    os.environ.update(json.loads(received[0]))
    return True


def _listen(fd: int, nice: int | None, group_nice: int | None,
            received: list[bytes]) -> None:
    """Read the worker's environment, then get this process's priority back (its
    threads' nice value, then its session's autogroup: the kernel may hold that write
    back 100 ms after another process's, see ``priority``): the script starts at its own
    priority."""
    with os.fdopen(fd, "rb") as pipe:
        received.append(pipe.readline())
    if received[0] and nice is not None:
        try:
            priority.restore(nice)
        except PermissionError as exc:  # can_restore said it could: say what happened
            print(f"potluck: this worker stays at nice {priority.LOWEST}: {exc}",
                  file=sys.stderr, flush=True)
    if received[0] and group_nice is not None:
        try:
            priority.restore_autogroup(group_nice)
        except OSError as exc:  # the kernel allows it: say what happened
            print(f"potluck: this worker's session stays at autogroup nice "
                  f"{priority.LOWEST}: {exc}", file=sys.stderr, flush=True)


def warm_up() -> None:
    """What a worker's first seconds cost: torch, torch.distributed, and the first
    optimizer (whose ``add_param_group`` imports ``torch._dynamo``, 1.5 s more). Only
    imports and a throwaway tensor: nothing the script could observe."""
    import torch
    import torch.distributed

    import potluck.cohort
    import potluck.preparation  # noqa: F401

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


def _record_error(exc: BaseException) -> None:
    """Write ``exc`` to the error file the launcher named, its traceback starting in
    the script."""
    exc.with_traceback(_user_frames(exc.__traceback__))
    path = env.error_file()
    if path is not None:
        write_error_file(path, exc)


def _record_finished(flags: UnusedFlags | None = None,
                     plain: PlainModels | None = None) -> None:
    """The script is done; whatever kills the process from here on is teardown. The
    plain model's observer sends its last steps (a failed script's does not: its rank
    then shows as silent, as it is)."""
    path = env.finished_file()
    if path is not None:
        write_finished_file(path)
    if plain is not None:
        plain.close()
    if flags is not None:
        flags.finished()


def _watch_plain_models() -> PlainModels | None:
    """Observe the first ``potluck.DataParallel`` the script builds itself, when the
    launcher asked for the status page or a metrics directory; else None. (This imports
    torch before the script does: only then.)"""
    try:
        worker = env.read_worker_env()
    except ConfigError:  # the script meets the same error and says it
        return None
    if not (worker.status or worker.metrics_dir):
        return None
    from potluck.metrics.plain import PlainModels

    return PlainModels(worker).start()


UNUSED_AFTER = 60.0  # s of a script without potluck.prepare before rank 0 says so

# What each flag that only potluck.prepare reads does not do without it.
_LOST = {"--status-port": "the status page shows no worker and no step (a model wrapped "
                          "in potluck.DataParallel shows its step times; torch DDP reports "
                          "nothing)",
         "--metrics-dir": "no metrics are written to {metrics_dir} (a model wrapped in "
                          "potluck.DataParallel writes its step times; torch DDP writes "
                          "nothing)",
         "--balance": "every worker keeps an equal share"}
# ... and what each does not do for a potluck.DataParallel without potluck.prepare.
_PARTIAL = {"--status-port": "the page shows its step times, not its samples/s, shares "
                             "or loss",
            "--metrics-dir": "the journals in {metrics_dir} hold step times, not samples: "
                             "`potluck plot` draws no throughput or shares",
            "--balance": "nothing: every worker keeps an equal share",
            "--elastic": "a lost worker restarts with all the others, as under torchrun "
                         "(it never joined a cohort), and no loader keeps each sample "
                         "trained exactly once"}

# Which model the script trains, seen from the bootstrap: None (no potluck.DataParallel
# was observed), "plain" (one on a torch process group) or "cohort" (on potluck.init()).
Front = Callable[[], "str | None"]


def prepare_flags(worker: env.WorkerEnv) -> list[str]:
    """The flags of ``potluck run`` this worker was started with that need
    ``potluck.prepare`` to take full effect."""
    given = (("--status-port", worker.status), ("--metrics-dir", bool(worker.metrics_dir)),
             ("--balance", worker.balance), ("--elastic", worker.elastic))
    return [flag for flag, on in given if on]


def _listed(flags: list[str]) -> str:
    return flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} and {flags[-1]}"


def unused_flags_line(flags: list[str], metrics_dir: str | None,
                      after: float | None = None) -> str:
    """One line: ``flags`` did nothing, since the script did not call ``potluck.prepare``
    (in its first ``after`` seconds; None: at all) nor built a ``potluck.DataParallel``."""
    when = ("which this script did not call" if after is None
            else f"which this script has not called in its first {after:g} s")
    lost = "; ".join(_LOST[flag].format(metrics_dir=metrics_dir) for flag in flags)
    return (f"potluck: {_listed(flags)} {'takes' if len(flags) == 1 else 'take'} effect "
            f"only in potluck.prepare(...), {when}: {lost}; call potluck.prepare(model, "
            f"optimizer, dataset, global_batch=...) or drop "
            f"{'it' if len(flags) == 1 else 'them'}")


def partial_flags_line(flags: list[str], metrics_dir: str | None) -> str:
    """One line: what ``flags`` do not do for a ``potluck.DataParallel`` the script
    built itself, without ``potluck.prepare``."""
    lost = "; ".join(f"{flag} ({_PARTIAL[flag].format(metrics_dir=metrics_dir)})"
                     for flag in flags)
    return (f"potluck: this script trains a potluck.DataParallel without "
            f"potluck.prepare(...), so it gets less from {lost}. For those, call "
            "potluck.prepare(model, optimizer, dataset, global_batch=...)")


class UnusedFlags:
    """Says once what ``flags`` did not do, if the script has not called
    ``potluck.prepare`` (``prepared()``) ``after`` seconds from ``start()``, or when it
    ends (``finished()``) without having called it. ``front()`` says whether a
    ``potluck.DataParallel`` of the script is observed, which the status page and the
    journals see without ``potluck.prepare``."""

    def __init__(self, flags: list[str], metrics_dir: str | None, *,
                 prepared: Callable[[], bool], say: Callable[[str], None],
                 after: float = UNUSED_AFTER, front: Front = lambda: None) -> None:
        self._flags, self._metrics_dir = flags, metrics_dir
        self._prepared, self._say, self._after = prepared, say, after
        self._front = front
        self._lock = threading.Lock()
        self._said = False
        self._timer = threading.Timer(after, self._check, args=(after,))
        self._timer.daemon = True

    @classmethod
    def for_this_worker(cls, plain: PlainModels | None = None) -> UnusedFlags | None:
        """Rank 0's watch over the flags it was started with; None elsewhere, or when
        none was given. ``plain``: the bootstrap's observer of a plain model."""
        try:
            worker = env.read_worker_env()
        except ConfigError:  # the script meets the same error and says it
            return None
        flags = prepare_flags(worker)
        if worker.rank != 0 or not flags:
            return None
        return cls(flags, worker.metrics_dir, prepared=_prepared, say=_say,
                   front=lambda: _front(plain)).start()

    def start(self) -> UnusedFlags:
        self._timer.start()
        return self

    def finished(self) -> None:
        self._timer.cancel()
        self._check(None)

    def line(self, after: float | None) -> str | None:
        """What to say now that ``potluck.prepare`` was not called; None: nothing."""
        front = self._front()
        if front is None:  # (--elastic: the launcher says it if a worker is lost)
            unused = [flag for flag in self._flags if flag in _LOST]
            return unused_flags_line(unused, self._metrics_dir, after) if unused else None
        partial = [flag for flag in self._flags
                   if flag != "--elastic" or front == "plain"]  # init() cohorts rejoin
        return partial_flags_line(partial, self._metrics_dir) if partial else None

    def _check(self, after: float | None) -> None:
        with self._lock:
            if self._said or self._prepared():
                return
            self._said = True
        line = self.line(after)
        if line is not None:
            self._say(line)


def _front(plain: PlainModels | None) -> str | None:
    if plain is None or not plain.watched:
        return None
    return "cohort" if plain.on_cohort else "plain"


def _prepared() -> bool:
    """Whether this process ran ``potluck.prepare`` (its observer was made)."""
    if "potluck.metrics.observing" not in sys.modules:
        return False  # never imported, so never called (importing it now would load torch)
    from potluck.metrics.observing import observed

    return observed()


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _planned_exit(message: str, code: int) -> None:
    """Say why and exit with ``code`` at once. The state is saved (or there was none to
    train); tearing down a Gloo group whose peer died has been seen to abort the process
    at interpreter exit ("terminate called without an active exception"), which would
    turn a planned stop into a crash report."""
    print(f"potluck: {message}", file=sys.stderr, flush=True)
    logging.shutdown()
    sys.stdout.flush()
    os._exit(code)


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """Drop the bootstrap's and runpy's frames: the report starts in the user's code."""
    while tb is not None and tb.tb_next is not None:
        name = tb.tb_frame.f_code.co_filename
        if name != __file__ and "runpy" not in name:
            break
        tb = tb.tb_next
    return tb


if __name__ == "__main__":
    main(sys.argv[1:])
