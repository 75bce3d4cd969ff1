"""A live ``potluck run --status-port 0`` of ``scripts/observed.py`` for the status
page's tests: start it, read the page's address from the launcher's first line, poll
``/api/status``, stop it with the script's stop file, reap everything."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.e2e.helpers import ROOT, SCRIPTS


class LiveRun:
    def __init__(self, tmp: Path, *run_args: str, script_args: tuple[str, ...] = ()) -> None:
        self.stop_file = tmp / "stop"
        self.log = (tmp / "launcher.log").open("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "potluck", "run", "--status-port", "0", *run_args,
             str(SCRIPTS / "observed.py"), "--stop-file", str(self.stop_file), *script_args],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT, text=True,
            start_new_session=True)
        try:
            self.url = self._address(deadline=time.monotonic() + 60)
        except BaseException:
            self.close()
            raise

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def _address(self, deadline: float) -> str:
        while time.monotonic() < deadline:
            for line in self.output().splitlines():
                if "status page at " in line:
                    return line.split("status page at ")[1].split()[0]
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no status page address; the launcher said:\n{self.output()}")

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "api/status", timeout=10) as answer:
            result: dict[str, Any] = json.loads(answer.read())
            return result

    def wait_for(self, what: str, check: Callable[[dict[str, Any]], bool],
                 timeout: float = 60.0) -> dict[str, Any]:
        """The first status for which ``check`` holds (polled every 0.1 s)."""
        deadline, status = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the run ended before {what}:\n{self.output()}")
            status = self.status()
            if check(status):
                return status
            time.sleep(0.1)
        raise AssertionError(f"no {what} within {timeout} s; last status: "
                             f"{json.dumps(status)[:2000]}\nlauncher:\n{self.output()}")

    def finish(self, timeout: float = 60.0) -> int:
        """Ask the script to stop; its exit code. Every rank stops after the same step,
        the first in which any of them saw the stop file (``scripts/observed.py``
        agrees on it through the step's own all-reduce)."""
        partial = self.stop_file.with_suffix(".tmp")
        partial.write_text("stop")
        partial.rename(self.stop_file)
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        """Kill the launcher if still running (a test's ``finally``); its workers die
        with it (the launcher gives each a parent-death signal)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)  # a stopped worker must die too
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()
