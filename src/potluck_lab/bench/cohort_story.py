"""What a person watching ``potluck bench cohort``'s potluck run sees: the live status
page, captured from an observer's machine on the same switch (a host with no cap and
no quota), while node 0 serves it and again once the store's host is lost and the
page has moved with the store; and ``potluck plot``'s PNGs of the whole run, from the
workers' journals (``--metrics-dir``). A capture that fails is a line in the report,
not a failed bench: the page is what a person looks at, the checks are elsewhere.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from potluck.errors import ConfigError
from potluck.metrics.plots import load_run, write_plots
from potluck_lab.browser import chromium_path, screenshot
from potluck_lab.machine.netns import BridgedHosts

# what an agent prints when it serves the page: node 0 at its start, a successor
# when the store moved to it (``launch/agent.py``)
_SERVED = re.compile(r"status page (?:is now )?at http://\S+?:(\d+)/")
SHOT_TIMEOUT_S = 60.0


def served_port(agent_log: str) -> int | None:
    """The port of the last status page an agent's log says it serves, or None."""
    found = _SERVED.findall(agent_log)
    return int(found[-1]) if found else None


@dataclass(frozen=True)
class Shot:
    """One capture: ``path`` when it was taken, else ``problem`` says why not."""

    label: str
    at_s: float  # seconds into the run
    path: Path | None
    problem: str | None = None

    def record(self) -> dict[str, object]:
        return {"label": self.label, "at_s": round(self.at_s, 1),
                "path": None if self.path is None else str(self.path),
                "problem": self.problem}


class Story:
    """Captures of the page from host ``observer`` of ``hosts``, into ``out``."""

    def __init__(self, hosts: BridgedHosts, observer: int, out: Path, started: float) -> None:
        self.hosts, self.observer, self.out, self.started = hosts, observer, out, started
        self.shots: list[Shot] = []

    def capture(self, label: str, host: int, port: int) -> Shot:
        at = time.time() - self.started
        if chromium_path() is None:
            shot = Shot(label, at, None, "no Chromium here (apt-get install chromium)")
        else:
            url = f"http://{self.hosts.addresses[host]}:{port}/"
            target = self.out / f"status-{label}.png"
            try:
                path: Path | None = screenshot(
                    url, target, size=(1280, 1400), timeout=SHOT_TIMEOUT_S,
                    prefix=self.hosts.command(self.observer, []))
                shot = Shot(label, at, path)
            except RuntimeError as exc:  # its first line here, Chromium's stderr kept
                kept = self.out / f"status-{label}.error.txt"
                kept.write_text(f"{exc}\n")
                shot = Shot(label, at, None, f"{str(exc).splitlines()[0]} (its stderr: {kept})")
        self.shots.append(shot)
        return shot


def plots(metrics_dir: Path, out: Path) -> tuple[list[Path], str | None]:
    """``potluck plot``'s PNGs of the run, and why there are none (or None)."""
    try:
        return write_plots(load_run(metrics_dir), out), None
    except ConfigError as exc:
        return [], str(exc)
