"""The lab's one job runner: the processes of a bench or a demo, however the run ends.

``Processes`` starts commands, each with its output in a log file, tells which one
ended, and stops and reaps them all: a process in a session of its own is stopped with
its whole group (what it started goes too). ``wait_all`` waits for some of them,
whatever their exit codes. ``process_tree`` lists a process and its descendants;
``kill_group`` kills a session's whole group, ``kill_tree`` a process and all its
descendants: a lost machine.
``run_agent`` runs the launcher's agent in this process, as ``potluck run`` would, while
a follower reads the workers' records.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from potluck.launch.config import LaunchConfig

_POLL_S = 0.05


def wait_all(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> bool:
    """Until every one of ``procs`` exited (True) or ``timeout`` s passed (False),
    whatever their exit codes: the last members of a job that lost others on the way
    (killed: a failed code) are waited for still (``Processes.wait`` ends at the first
    failure)."""
    deadline = time.monotonic() + timeout
    while any(proc.poll() is None for proc in procs):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


class Processes:
    """Processes started for one run; ``stop`` (also on leaving a ``with``) reaps them."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self._sessions: list[bool] = []
        self._logs: list[IO[bytes]] = []

    def start(self, argv: Sequence[str], log: Path, *, env: Mapping[str, str] | None = None,
              session: bool = True) -> subprocess.Popen[bytes]:
        """Start ``argv``, its output (and errors) in ``log``; ``session``: in a session
        and process group of its own, so ``stop`` reaches what it starts."""
        self._logs.append(log.open("wb"))
        proc = subprocess.Popen(list(argv), env=None if env is None else dict(env),
                                stdin=subprocess.DEVNULL, stdout=self._logs[-1],
                                stderr=subprocess.STDOUT, start_new_session=session)
        self.procs.append(proc)
        self._sessions.append(session)
        return proc

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def ended(self) -> list[int]:
        """The indices of the processes that have exited."""
        return [i for i, proc in enumerate(self.procs) if proc.poll() is not None]

    def wait(self, timeout: float) -> bool:
        """Until every process exited (True), or one failed, or ``timeout`` s passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            codes = [proc.poll() for proc in self.procs]
            if all(code is not None for code in codes):
                return True
            if any(codes):
                return False
            time.sleep(_POLL_S)
        return False

    def stop(self, grace: float = 0.0, *, terminate: bool = False) -> None:
        """Stop every process still running and reap them all: SIGTERM first if
        ``terminate``, up to ``grace`` seconds to exit, then SIGKILL (to the whole group
        of a process in its own session, even one that has exited)."""
        if terminate:
            for proc, session in zip(self.procs, self._sessions, strict=True):
                if proc.poll() is None:
                    _signal(proc, session, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc, session in zip(self.procs, self._sessions, strict=True):
            if proc.poll() is None or session:
                _signal(proc, session, signal.SIGKILL)
            proc.wait()
        # A SIGKILL is delivered at once but the killed die when next scheduled: a
        # session's grandchildren (not ours to wait for) may still run a moment.
        for proc, session in zip(self.procs, self._sessions, strict=True):
            if session:
                _wait_gone(proc.pid)
        for log in self._logs:
            log.close()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``/proc``'s children lists)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return out


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s process group (a process started in a session of its own)."""
    _signal(proc, True, signal.SIGKILL)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant, also those in sessions of their own (as
    torchrun starts its workers): a lost machine. ``pid`` is stopped first, so that it
    starts nothing while its tree is read."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
    for member in process_tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def _wait_gone(group: int, limit: float = 10.0) -> None:
    """Until no process of the process group ``group`` runs (a zombie has ended; its new
    parent reaps it), at most ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while _running_in(group) and time.monotonic() < deadline:
        time.sleep(0.01)


def _running_in(group: int) -> bool:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:  # (the command may hold spaces and parentheses: fields follow the last ")")
            state, _, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError, IndexError):
            continue  # it ended while we looked
        if int(pgrp) == group and state != "Z":
            return True
    return False


def _signal(proc: subprocess.Popen[bytes], session: bool, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if session:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


class Follower(Protocol):
    """What reads the workers' records while the agent runs (a progress display, the
    chaos demo's driver)."""

    def start(self) -> None: ...

    def stop(self) -> object: ...


def run_agent(launch: LaunchConfig, log_path: Path, follower: Follower,
              emitted: list[str], *, append: bool = True) -> int:
    """Run the launcher's agent as ``potluck run`` would, the workers' output in
    ``log_path`` and ``follower`` reading their records meanwhile; the agent's lines
    are appended to ``emitted`` (kept when this raises). Returns its exit code."""
    from potluck.launch.agent import Agent

    with log_path.open("ab" if append else "wb") as log:
        def emit(line: str) -> None:
            emitted.append(line)
            log.write(line.encode() + b"\n")
            log.flush()
            if "status page at " in line:  # worth seeing while it runs
                print(line.replace("potluck run: ", "live "), flush=True)

        follower.start()
        try:
            return Agent(launch, emit=emit, stdout=log, stderr=log).run()
        finally:
            follower.stop()
