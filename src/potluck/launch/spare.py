"""A warm spare: a worker process started before it is needed, so that a restart does
not pay for a Python interpreter importing torch.

In an elastic job a dead worker is replaced while the others train on. A fresh
interpreter needs seconds of CPU before it can join (``import torch`` and the first
optimizer's ``torch._dynamo``; 4 s on a 2-core VM), taken from the survivors when the
cores are shared. The agent keeps one spare per node: the same command line as a
worker, waiting (at the lowest CPU priority, see ``priority``) on a pipe for the
environment of the worker it will become. ``take`` hands it that environment; the
spare then runs the script exactly as a freshly started worker would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Protocol

from potluck import env as names


class WorkerProcess(Protocol):
    """What the agent uses of a worker's process: a ``subprocess.Popen``, or a process
    the spare template forked (``forked.ForkedProcess``)."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    @property
    def stdout(self) -> IO[bytes] | None: ...
    @property
    def stderr(self) -> IO[bytes] | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...


class WaitingSpare(Protocol):
    """A spare process waiting for the worker it becomes: ``Spare`` or ``ForkedSpare``."""

    def take(self, environ: Mapping[str, str],
             give_up: Callable[[], bool] = ...) -> WorkerProcess | None: ...
    def discard(self) -> None: ...


class Spare:
    """One waiting worker process; ``take`` it once, or ``discard`` it."""

    def __init__(self, command: Sequence[str], environ: Mapping[str, str]) -> None:
        read, write = os.pipe()
        self._write: int | None = write
        try:
            self.proc = subprocess.Popen(
                list(command), env={**environ, names.STANDBY_FD: str(read)},
                pass_fds=(read,), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
            )
        except BaseException:
            self._close()
            raise
        finally:
            os.close(read)

    def take(self, environ: Mapping[str, str],
             give_up: Callable[[], bool] = lambda: False) -> subprocess.Popen[bytes] | None:
        """The process, now running the script as a worker with ``environ``; None if
        the spare died waiting (it is reaped: start a worker the usual way). It is there
        from the start: ``give_up`` is never asked."""
        line = json.dumps(dict(environ)).encode() + b"\n"
        try:
            if self._write is not None and self.proc.poll() is None:
                view = memoryview(line)
                while view:  # a large environment may take several writes
                    view = view[os.write(self._write, view):]
                return self.proc
        except BrokenPipeError:
            pass
        finally:
            self._close()
        self._reap()
        return None

    def discard(self) -> None:
        """Not needed: end it (it has run no user code, so nothing is lost) and reap it."""
        self._close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._reap()

    def _close(self) -> None:
        if self._write is not None:
            os.close(self._write)
            self._write = None

    def _reap(self) -> None:
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
