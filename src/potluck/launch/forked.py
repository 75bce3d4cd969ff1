"""The agent's side of the spare template (``template``): spares forked from a warm
process instead of started afresh.

``Template`` starts the template process and asks it for spares; ``ForkedSpare`` is one
request, taken or discarded as a ``spare.Spare`` is; ``ForkedProcess`` is the worker it
became, with what the agent uses of a ``subprocess.Popen`` (``pid``, ``stdout``,
``stderr``, ``poll``, ``wait``, ``returncode``). A forked process is the template's
child, so its exit status comes from the template; a process that was still running
when the template died was killed with it (parent-death signal): once it is gone it
reads as killed by SIGKILL. The agent's side imports no torch.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO

from potluck import env as names

_MAX_MESSAGE = 1 << 16
_POLL = 0.01
# How long a restart waits for a spare the template has not forked yet: the template
# serves no request before it is warm (2-5 s after the job started, more on a loaded
# machine); a fresh interpreter would need as long.
ARRIVAL_TIMEOUT = 30.0


class ForkedProcess:
    """A worker forked by the template: the parts of ``Popen`` the agent uses."""

    def __init__(self, pid: int, stdout: IO[bytes], stderr: IO[bytes],
                 template: Template) -> None:
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self.returncode: int | None = None
        self._template = template

    def ended(self, code: int) -> None:
        """The template reaped it."""
        self.returncode = code

    def poll(self) -> int | None:
        if self.returncode is None and not self._template.alive:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:  # killed with the template, reaped by init
                self.returncode = -signal.SIGKILL
            except PermissionError:  # the pid was reused by another user's process
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
            time.sleep(_POLL)
        return code


class ForkedSpare:
    """One spare asked of the template; ``take`` it once, or ``discard`` it."""

    def __init__(self, template: Template, stdout: int, stderr: int, standby: int) -> None:
        self._template = template
        self._lock = threading.Lock()  # the template's reader calls ``arrived``
        self._stdout: IO[bytes] | None = os.fdopen(stdout, "rb")
        self._stderr: IO[bytes] | None = os.fdopen(stderr, "rb")
        self._standby: int | None = standby
        self._proc: ForkedProcess | None = None  # once the template forked it
        self._settled = threading.Event()  # forked, or never will be

    def arrived(self, pid: int) -> ForkedProcess | None:
        """The template forked it (called by the template's reader); None if it was
        discarded meanwhile (it exits by itself: its pipe is closed)."""
        with self._lock:
            self._settled.set()
            if self._stdout is None or self._stderr is None:
                return None
            self._proc = ForkedProcess(pid, self._stdout, self._stderr, self._template)
            return self._proc

    def abandoned(self) -> None:
        """The template died before it forked this one."""
        self._settled.set()

    def take(self, environ: Mapping[str, str]) -> ForkedProcess | None:
        """The process, now running the script as a worker with ``environ`` (waits up to
        ``ARRIVAL_TIMEOUT`` for the template to fork it); None if it did not come or
        died waiting (start a worker the usual way)."""
        self._settled.wait(ARRIVAL_TIMEOUT)
        with self._lock:
            proc, standby = self._proc, self._standby
        if proc is not None and proc.poll() is None and standby is not None:
            view = memoryview(json.dumps(dict(environ)).encode() + b"\n")
            try:
                while view:
                    view = view[os.write(standby, view):]
            except BrokenPipeError:
                pass
            else:
                with self._lock:
                    self._stdout = self._stderr = None  # the worker's streams now
                    self._close()
                return proc
        self.discard()
        return None

    def discard(self) -> None:
        """Not needed: it exits on its own when its pipe closes (it ran no user code);
        killed as well if it is there, so that it is gone when this returns."""
        with self._lock:
            self._close()
            proc, streams = self._proc, (self._stdout, self._stderr)
            self._stdout = self._stderr = None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
        for stream in streams:
            if stream is not None:
                stream.close()

    def _close(self) -> None:
        if self._standby is not None:
            os.close(self._standby)
            self._standby = None


class Template:
    """The template process and the agent's conversation with it."""

    def __init__(self, argv: Sequence[str], environ: Mapping[str, str]) -> None:
        """``argv``: the worker bootstrap's (``[-m] script args...``), which every spare
        runs; also the template's own, so that ``ps`` shows what it and its children
        are for."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "potluck.launch.template", *argv],
                env={**environ, names.TEMPLATE_FD: str(theirs.fileno())},
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._waiting: dict[int, ForkedSpare] = {}
        self._forked: dict[int, ForkedProcess] = {}
        self.alive = True
        self._reader = threading.Thread(target=self._read, name="potluck-template",
                                        daemon=True)
        self._reader.start()

    def spare(self, environ: Mapping[str, str]) -> ForkedSpare | None:
        """Ask for a spare with ``environ`` (it arrives once the template is warm); None
        if the template is gone."""
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        standby_read, standby_write = os.pipe()
        spare = ForkedSpare(self, out_read, err_read, standby_write)
        ident = next(self._ids)
        try:
            with self._lock:
                if not self.alive:
                    spare.discard()
                    return None
                self._waiting[ident] = spare
            request = json.dumps({"id": ident, "env": dict(environ)})
            socket.send_fds(self._sock, [request.encode()],
                            [out_write, err_write, standby_read])
        except OSError:
            with self._lock:
                self._waiting.pop(ident, None)
            spare.discard()
            return None
        finally:
            for fd in (out_write, err_write, standby_read):
                os.close(fd)
        return spare

    def close(self) -> None:
        """End the template (it forks no more); its children die with it."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._reader.join(timeout=5.0)
        self._sock.close()

    def _read(self) -> None:
        try:
            while True:
                message = self._sock.recv(_MAX_MESSAGE)
                if not message:
                    return
                self._handle(json.loads(message))
        except OSError:
            return
        finally:
            with self._lock:
                self.alive = False
                waiting, self._waiting = list(self._waiting.values()), {}
            for spare in waiting:
                spare.abandoned()

    def _handle(self, message: dict[str, int]) -> None:
        """The template answers a request before it reports that child's exit."""
        with self._lock:
            if "exit" in message:
                proc = self._forked.pop(message["exit"], None)
                if proc is not None:
                    proc.ended(message["code"])
                return
            spare = self._waiting.pop(message["id"])
            proc = spare.arrived(message["pid"])
            if proc is not None:  # (None: discarded before it came; it exits by itself)
                self._forked[proc.pid] = proc
