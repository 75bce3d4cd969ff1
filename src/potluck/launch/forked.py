"""The agent's side of the spare template (``template``): spares forked from a warm
process instead of started afresh.

``Template`` starts the template process and asks it for spares; ``ForkedSpare`` is one
request, taken or discarded as a ``spare.Spare`` is; ``ForkedProcess`` is the worker it
became, with what the agent uses of a ``subprocess.Popen`` (``pid``, ``stdout``,
``stderr``, ``poll``, ``wait``, ``returncode``). A forked process is the template's
child, so its exit status comes from the template. When the template is gone (it died,
or the agent could not understand it and ended it), every process it forked that had
not ended is reported killed by SIGKILL at once: the parent-death signal killed it with
the template, and neither waiting for it nor signalling its pid again (which may be
another process's by then) is safe. The agent's side imports no torch.
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
from collections.abc import Callable, Mapping
from typing import IO, Any

from potluck import env as names

_MAX_MESSAGE = 1 << 16
_POLL = 0.01
_SLICE = 0.05  # s: how often a restart waiting for its spare checks whether to give up
# How long a restart waits for a spare the template has not forked yet: the template
# serves no request before it is warm (2-5 s after the job started, more on a loaded
# machine); a fresh interpreter would need as long.
ARRIVAL_TIMEOUT = 30.0
_CLOSE_GRACE = 2.0  # s: for the template to end by itself once the agent is done


class ForkedProcess:
    """A worker forked by the template: the parts of ``Popen`` the agent uses."""

    def __init__(self, pid: int, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self.returncode: int | None = None

    def ended(self, code: int) -> None:
        """The template reaped it, or died (``-SIGKILL``): the first word stands."""
        if self.returncode is None:
            self.returncode = code

    def poll(self) -> int | None:
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
            self._proc = ForkedProcess(pid, self._stdout, self._stderr)
            return self._proc

    def abandoned(self) -> None:
        """It will not come (the template died, or could not fork)."""
        self._settled.set()

    def take(self, environ: Mapping[str, str],
             give_up: Callable[[], bool] = lambda: False) -> ForkedProcess | None:
        """The process, now running the script as a worker with ``environ``; None if it
        did not come within ``ARRIVAL_TIMEOUT`` (the template warming up), ``give_up()``
        said so meanwhile, or it died waiting: start a worker the usual way."""
        deadline = time.monotonic() + ARRIVAL_TIMEOUT
        while not self._settled.wait(_SLICE):
            if give_up() or time.monotonic() >= deadline:
                break
        with self._lock:
            proc, standby = self._proc, self._standby
        if proc is not None and proc.poll() is None and standby is not None \
                and self._template.alive:
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
        """Not needed: it exits on its own when its pipe closes (it ran no user code).
        If it is there it is killed as well and waited for (5 s at most: a spare that
        has not yet left the template's process group is ended by its closed pipe)."""
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

    def __init__(self, argv: list[str], environ: Mapping[str, str]) -> None:
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
        self.forks = True  # False once it could not fork: ask no more of it
        self._reader = threading.Thread(target=self._read, name="potluck-template",
                                        daemon=True)
        self._reader.start()

    def spare(self, environ: Mapping[str, str]) -> ForkedSpare | None:
        """Ask for a spare with ``environ`` (it arrives once the template is warm); None
        if the template is gone or could not fork before."""
        if not self.forks:
            return None
        fds: list[int] = []
        try:
            for _ in range(3):
                fds.extend(os.pipe())
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        out_read, out_write, err_read, err_write, standby_read, standby_write = fds
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
        """End the template (it forks no more); its children die with it, and any still
        running reads as killed: call it once the workers it forked have stopped."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        try:
            self.proc.wait(timeout=_CLOSE_GRACE)
        except subprocess.TimeoutExpired:  # still warming up: nothing of it is needed
            self._kill()
        self._reader.join(timeout=5.0)
        self._sock.close()

    def _kill(self) -> None:
        if self.proc.poll() is None:  # (not after it was reaped: the id may be reused)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def _read(self) -> None:
        try:
            while True:
                message = self._sock.recv(_MAX_MESSAGE)
                if not message:
                    return
                self._handle(json.loads(message))
        except Exception:  # a broken socket, or not the template's protocol: end it
            self._kill()  # (its children with it) rather than guess what it does
        finally:
            self._gone()

    def _gone(self) -> None:
        """The template is gone (or ending: it closes its socket only on its way out):
        what it forked dies with it, what it did not never will be."""
        with self._lock:
            self.alive = False
            waiting, self._waiting = list(self._waiting.values()), {}
            forked, self._forked = list(self._forked.values()), {}
        for spare in waiting:
            spare.abandoned()
        for proc in forked:
            proc.ended(-signal.SIGKILL)

    def _handle(self, message: dict[str, Any]) -> None:
        """The template answers a request before it reports that child's exit."""
        with self._lock:
            if "exit" in message:
                proc = self._forked.pop(int(message["exit"]), None)
                if proc is not None:
                    proc.ended(int(message["code"]))
                return
            spare = self._waiting.pop(int(message["id"]))
            if "error" in message:  # it could not fork: from now on spares start afresh
                self.forks = False  # (it stays: the workers it forked live in it)
                spare.abandoned()
                return
            proc = spare.arrived(int(message["pid"]))
            if proc is not None:  # (None: discarded before it came; it exits by itself)
                self._forked[proc.pid] = proc
