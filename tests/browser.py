"""Headless Chromium for tests: the runner is ``potluck_lab.browser`` (the cohort bench
takes screenshots with it too); here, installing it where it is missing, and keeping a
test's screenshot where a person can look at it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from potluck_lab.browser import chromium_path, dump_dom, screenshot

__all__ = ["chromium_path", "dump_dom", "ensure_chromium", "keep_artifact", "screenshot",
           "why_no_install"]

INSTALL_TIMEOUT_S = 300.0  # each of apt-get update and install: within the tests' 900 s


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


def keep_artifact(path: Path, name: str | None = None) -> Path:
    """Copy a test's output (a screenshot) to ``$POTLUCK_TEST_ARTIFACTS`` or, unset, to
    ``test-artifacts/`` in the checkout (git-ignored), where a person can look at it."""
    root = Path(os.environ.get("POTLUCK_TEST_ARTIFACTS")
                or Path(__file__).resolve().parents[1] / "test-artifacts")
    root.mkdir(parents=True, exist_ok=True)
    target = root / (name or path.name)
    shutil.copy(path, target)
    return target


