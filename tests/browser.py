"""Headless Chromium for tests: find (or install) it, dump a page's DOM, take a screenshot.

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
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome")
INSTALL_TIMEOUT_S = 300.0  # each of apt-get update and install: within the tests' 900 s
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-dev-shm-usage")


def chromium_path() -> str | None:
    """The first of chromium, chromium-browser, google-chrome on PATH, or None."""
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def why_no_install() -> str | None:
    """Why ``ensure_chromium`` could not install Chromium here, or None when it can."""
    if os.name != "posix" or os.geteuid() != 0:
        return "not root, so it cannot apt-get install chromium"
    if not Path("/etc/debian_version").is_file():
        return "not a Debian system, so there is no `chromium` package to apt-get install"
    if shutil.which("apt-get") is None:
        return "apt-get is not on PATH"
    return None


def ensure_chromium() -> str | None:
    """Chromium's path; installs Debian's ``chromium`` when missing and allowed; else None.

    The install runs ``apt-get update`` then ``apt-get install -y --no-install-recommends
    chromium`` (about 125 MB downloaded, 415 MB on disk, 15 s on a fast mirror), each
    bounded by ``INSTALL_TIMEOUT_S``; a failed install leaves None.
    """
    found = chromium_path()
    if found or why_no_install() is not None:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"],
                 ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]):
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=env,
                                  timeout=INSTALL_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return None
        if done.returncode != 0:
            return None
    return chromium_path()


def dump_dom(url: str, *, wait_ms: int = 3000, timeout: float = 60) -> str:
    """The DOM of ``url`` after ``wait_ms`` of (virtual) time, as HTML text."""
    return _run_chromium([f"--virtual-time-budget={wait_ms}", "--dump-dom", url], timeout)


def screenshot(url: str, path: str | Path, *, size: tuple[int, int] = (1280, 900),
               wait_ms: int = 3000, timeout: float = 60) -> Path:
    """A PNG of ``url`` at ``size`` (width, height) after ``wait_ms``; returns its path."""
    target = Path(path).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    _run_chromium([f"--virtual-time-budget={wait_ms}", f"--window-size={size[0]},{size[1]}",
                   f"--screenshot={target}", url], timeout)
    if not target.is_file():
        raise RuntimeError(f"chromium exited 0 but wrote no screenshot at {target}")
    return target


def _run_chromium(args: list[str], timeout: float) -> str:
    """Run headless Chromium with a throwaway profile; its stdout, or raise with stderr."""
    binary = chromium_path()
    if binary is None:
        raise RuntimeError(f"no Chromium on PATH (looked for {', '.join(NAMES)}); "
                           "call ensure_chromium() or apt-get install chromium")
    with tempfile.TemporaryDirectory(prefix="potluck-chromium-",
                                     ignore_cleanup_errors=True) as profile:
        argv = [binary, *FLAGS, f"--user-data-dir={profile}", *args]
        # its own session, so a timeout kills the renderer and GPU children too
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
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


def keep_artifact(path: Path, name: str | None = None) -> Path:
    """Copy a test's output (a screenshot) to ``$POTLUCK_TEST_ARTIFACTS`` or, unset, to
    ``test-artifacts/`` in the checkout (git-ignored), where a person can look at it."""
    root = Path(os.environ.get("POTLUCK_TEST_ARTIFACTS")
                or Path(__file__).resolve().parents[1] / "test-artifacts")
    root.mkdir(parents=True, exist_ok=True)
    target = root / (name or path.name)
    shutil.copy(path, target)
    return target


def _tail(text: str | None, lines: int = 20) -> str:
    return "\n".join((text or "").splitlines()[-lines:])
