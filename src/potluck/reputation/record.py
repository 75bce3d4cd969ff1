"""The record's file: one JSON object a line, one line per worker identity and run.

    {"v": 1, "time": 1767225600.0, "run": "job-7", "worker": "lab-a100-1",
     "samples_per_s": 410.5, "in_cohort_s": 3420.0, "run_s": 3600.0,
     "losses": 1, "restarts": 0, "strikes": 0, "quarantined": false}

``worker`` is the identity a worker keeps across runs (``POTLUCK_WORKER_ID``, or the
id its node's agent keeps in a file), never its address. ``samples_per_s`` is its
measured speed (local work only); ``in_cohort_s`` the time it was a member, of the
run's ``run_s``; ``losses`` the times the cohort lost it, ``restarts`` the times its
process was started again; ``strikes`` what trust held against it, and whether it was
quarantined. Appending is one ``write`` of whole lines, so two runs that end together
do not interleave within a line; a line torn by a writer that was killed is ended
before the next, and skipped on reading.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

VERSION = 1


@dataclass(frozen=True)
class RunRecord:
    time: float
    run: str
    worker: str
    samples_per_s: float | None
    in_cohort_s: float
    run_s: float
    losses: int = 0
    restarts: int = 0
    strikes: int = 0
    quarantined: bool = False

    def line(self) -> str:
        return json.dumps({"v": VERSION, **asdict(self)}, sort_keys=True)


def append(path: str | Path, records: Iterable[RunRecord]) -> int:
    """Append ``records`` to ``path`` (made, with its folder, if missing); how many."""
    lines = "".join(r.line() + "\n" for r in records)
    if not lines:
        return 0
    file = Path(path).expanduser()
    file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            lines = "\n" + lines  # a line torn by a killed writer stays apart
        os.write(fd, lines.encode())
    finally:
        os.close(fd)
    return lines.count("\n")


def load(path: str | Path) -> list[RunRecord]:
    """Every record in ``path`` (none if it does not exist), in file order."""
    file = Path(path).expanduser()
    if not file.exists():
        return []
    out = []
    for line in file.read_text().splitlines():
        record = _parse(line)
        if record is not None:
            out.append(record)
    return out


def _parse(line: str) -> RunRecord | None:
    try:
        raw = json.loads(line)
        speed = raw.get("samples_per_s")
        record = RunRecord(
            time=float(raw["time"]), run=str(raw["run"]), worker=str(raw["worker"]),
            samples_per_s=None if speed is None else float(speed),
            in_cohort_s=float(raw["in_cohort_s"]), run_s=float(raw["run_s"]),
            losses=int(raw.get("losses", 0)), restarts=int(raw.get("restarts", 0)),
            strikes=int(raw.get("strikes", 0)), quarantined=bool(raw.get("quarantined")))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not (math.isfinite(record.run_s) and record.run_s >= 0 and record.in_cohort_s >= 0):
        return None
    return record
