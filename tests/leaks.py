"""A pytest plugin that fails any test which leaks what it started.

After each test it compares what the test process holds with what it held before:

- environment variables set, changed or removed (``os.environ``);
- Python threads still running;
- child processes still alive (a forkserver or resource tracker that
  ``multiprocessing`` keeps for the whole session is not the test's);
- TCP ports this process still listens on.

A thread or process gets a short grace period to end (a reaped child, a thread
joining), then the test fails with what it left. The failure is the test's own: it
comes in the teardown of the test that leaked, not in a later one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

GRACE = 5.0  # seconds a thread or child process may take to end after its test
_SESSION_CHILDREN = ("forkserver", "resource_tracker", "semaphore_tracker")
# Set by pytest for each phase, and by torch itself the first time inductor is imported.
_NOT_THE_TESTS = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}


def children() -> dict[int, str]:
    """This process's live children (pid -> command line), zombies left out."""
    me, found = os.getpid(), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # (the command may hold spaces and parentheses: fields follow the last ")")
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if int(ppid) != me or state == "Z":
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (OSError, ValueError, IndexError):
            continue  # it ended while we looked
        if not any(name in cmdline for name in _SESSION_CHILDREN):
            found[int(entry.name)] = cmdline
    return found


def listening_ports() -> set[int]:
    """TCP ports (IPv4 and IPv6) on which a socket of this process listens."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def threads() -> dict[int, str]:
    return {t.ident or 0: t.name for t in threading.enumerate() if t.is_alive()}


def _settle(now: dict[int, str], before: dict[int, str], probe: object) -> dict[int, str]:
    """What is new since ``before``, after up to ``GRACE`` s for it to end."""
    deadline = time.monotonic() + GRACE
    new = {k: v for k, v in now.items() if k not in before}
    while new and time.monotonic() < deadline:
        time.sleep(0.05)
        current = probe()  # type: ignore[operator]
        new = {k: v for k, v in current.items() if k not in before}
    return new


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    env, started, kids, ports = dict(os.environ), threads(), children(), listening_ports()
    yield
    found = []
    changed = {k for k in set(env) | set(os.environ)
               if env.get(k) != os.environ.get(k) and k not in _NOT_THE_TESTS}
    if changed:
        found.append("environment variables changed: " + ", ".join(
            f"{k}={os.environ.get(k)!r} (was {env.get(k)!r})" for k in sorted(changed)))
        for k in changed:  # (the next test starts clean)
            if k in env:
                os.environ[k] = env[k]
            else:
                os.environ.pop(k, None)
    left = _settle(threads(), started, threads)
    if left:
        found.append("threads still running: " + ", ".join(sorted(left.values())))
    alive = _settle(children(), kids, children)
    if alive:
        found.append("child processes still alive: " + "; ".join(
            f"pid {pid}: {cmd[:120]}" for pid, cmd in sorted(alive.items())))
        for pid in alive:  # (killed and reaped, so the next test starts clean)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    still = listening_ports() - ports
    if still:
        found.append(f"still listening on port(s) {sorted(still)}")
    if found:
        pytest.fail(f"{request.node.nodeid} leaked: " + "; ".join(found), pytrace=False)
