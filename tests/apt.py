"""Debian packages a test needs, installed by the test set-up (CI's machine is root on
Debian and starts bare): why one cannot be installed here, and the install itself, under
a lock so that two pytest-xdist workers do not both run apt-get (one dpkg at a time)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

INSTALL_TIMEOUT_S = 150.0  # each of apt-get update and install


def why_not_installable() -> str | None:
    """Why apt-get cannot install a package here, or None when it can."""
    if os.name != "posix" or os.geteuid() != 0:
        return "this is not root, so it cannot apt-get install it"
    if not Path("/etc/debian_version").is_file() or shutil.which("apt-get") is None:
        return "this is not Debian (no apt-get, no Debian package)"
    return None


def install(package: str, present: Callable[[], bool]) -> str | None:
    """apt-get update and install ``package`` unless ``present()`` (another test worker
    may have installed it while this one waited for the lock); the failure, or None."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with Path(f"/tmp/potluck-{package}-install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if present():
            return None
        for argv in (["apt-get", "update"],
                     ["apt-get", "install", "-y", "--no-install-recommends", package]):
            try:
                done = subprocess.run(argv, capture_output=True, text=True, env=env,
                                      timeout=INSTALL_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                return f"{' '.join(argv)} ran past {INSTALL_TIMEOUT_S:.0f} s"
            if done.returncode != 0:
                return f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-500:]}"
    return None if present() else f"{package} is still not installed"
