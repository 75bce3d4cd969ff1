"""Headless Chromium: find it, dump a page's DOM, take a screenshot (a bench's artifact,
a test's check). ``prefix`` runs it through another command, e.g. ``ip netns exec NAME``
to look at a page served inside a network namespace.

What works (Debian 12's ``chromium`` 1xx, as root, no display, no D-Bus):
``--headless --no-sandbox --disable-gpu --no-first-run --disable-dev-shm-usage`` with a
fresh ``--user-data-dir``. Chromium complains on stderr about D-Bus and the wrapper
script about ``[: unexpected operator``; both are harmless, only the exit code counts.

``--virtual-time-budget=N`` runs the page's timers on virtual time, but a pending
network request pauses that clock until it is answered; a page that polls with
``fetch`` + ``setTimeout(poll, 1000)`` therefore gets about N/1000 + 1 real answers
before ``--dump-dom`` / ``--screenshot`` fire (the status page polled 3 times in a
3000 ms budget, each a fresh snapshot), and the whole run takes under a second of
wall time. ``Date.now()`` in the page is virtual too (it advances by the budget). A
server that never answers stalls virtual time, so every run has a real timeout.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome")
SHORT = 40  # the longest temporary directory Chromium's socket paths fit under
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-dev-shm-usage")


def chromium_path() -> str | None:
    """The first of chromium, chromium-browser, google-chrome on PATH, or None."""
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def dump_dom(url: str, *, wait_ms: int = 3000, timeout: float = 60,
             prefix: Sequence[str] = ()) -> str:
    """The DOM of ``url`` after ``wait_ms`` of (virtual) time, as HTML text."""
    return run_chromium([f"--virtual-time-budget={wait_ms}", "--dump-dom", url], timeout,
                        prefix)


def screenshot(url: str, path: str | Path, *, size: tuple[int, int] = (1280, 900),
               wait_ms: int = 3000, timeout: float = 60,
               prefix: Sequence[str] = ()) -> Path:
    """A PNG of ``url`` at ``size`` (width, height) after ``wait_ms``; returns its path."""
    target = Path(path).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    run_chromium([f"--virtual-time-budget={wait_ms}", f"--window-size={size[0]},{size[1]}",
                  f"--screenshot={target}", url], timeout, prefix)
    if not target.is_file():
        raise RuntimeError(f"chromium exited 0 but wrote no screenshot at {target}")
    return target


def run_chromium(args: list[str], timeout: float, prefix: Sequence[str] = ()) -> str:
    """Run headless Chromium with a throwaway profile; its stdout, or raise with stderr."""
    binary = chromium_path()
    if binary is None:
        raise RuntimeError(f"no Chromium on PATH (looked for {', '.join(NAMES)}); "
                           "apt-get install chromium")
    # Chromium's singleton socket goes in $TMPDIR, and a socket's path may not pass 107
    # bytes: under a long $TMPDIR (a test's) Chromium aborts ("Socket path too long").
    base = tempfile.gettempdir()
    with tempfile.TemporaryDirectory(prefix="plc-", dir=base if len(base) <= SHORT else "/tmp",
                                     ignore_cleanup_errors=True) as profile:
        argv = [*prefix, binary, *FLAGS, f"--user-data-dir={profile}", *args]
        # its own session, so a timeout kills the renderer and GPU children too
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env={**os.environ, "TMPDIR": profile})
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            try:
                _, stderr = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a child outside the group holds the pipes
                stderr = "(no stderr: a child process kept its pipes open)"
            raise RuntimeError(f"chromium ran past {timeout} s: {' '.join(argv)}\n"
                               f"{_tail(stderr)}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"chromium exited {proc.returncode}: {' '.join(argv)}\n"
                           f"{_tail(stderr)}")
    return stdout


def _tail(text: str | None, lines: int = 20) -> str:
    return "\n".join((text or "").splitlines()[-lines:])
