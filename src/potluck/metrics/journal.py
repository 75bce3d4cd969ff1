"""The one record format of potluck's JSON-lines journals: the demo's metrics, the chaos
demo's worker and driver records, and the logs of ``potluck bench faults``.

A record is one JSON object on one line: ``{"kind": str, "time": float, "pid": int,
...fields}``, ``time`` the wall clock (seconds since the epoch) when it was written and
``pid`` the writing process. Non-finite floats are written as ``null``. In ``step`` and
``redo`` records ``step`` is a global step's index, from 0; in ``joined``, ``held`` and
``waited`` it is the number of steps committed so far. The kinds and their fields
(``?``: not every writer writes it):

==========  ==============================================================================
``hello``   a worker process started: ``launch_rank``, ``restart`` (the launcher's count)
``member``  the process trains: ``rank`` (in the job), ``workers``, ``generation``;
            ``launch_rank?``, ``worker_id?``, ``joined_late?``, ``admitted?``, ``resumed?``
``joined``  a restarted worker received the live state: ``step``, ``rank``, ``generation``,
            ``workers``
``step``    a committed global step: ``step``, ``generation``, ``workers``; ``loss?``,
            ``step_s?``, ``samples_per_s?``, ``tokens_per_s?``, ``sync_s?``, ``lr?``,
            ``redone?`` (the demo's metrics, the chaos worker's rank 0); ``shares?``
            (samples per rank of the step: ``loader.split``), ``speeds?`` (samples/s per
            rank, the balancer's), ``phase?`` (the uneven demo's ``balanced``/``equal``)
``redo``    a step whose collectives failed, trained again: ``step``, ``generation`` and
            ``workers`` of the generation that redoes it
``event``   a membership change, ``potluck.Cohort.events``' fields: ``generation``,
            ``cause``, ``left``, ``joined``, ``world_size``, ``recovery_s``; or a note
            (``potluck.events``): ``what``, ``text``, ``step?``, ``member?``
``held``    the chaos victim stopped for its SIGKILL once ``step`` steps had committed
``waited``  rank 0 waited for a restarted worker: ``step``, ``waited_s``, ``asked``,
            ``workers``
``kill``    a driver SIGKILLed a worker: ``target`` (its pid); ``launch_rank?``,
            ``after_step?`` (the last step committed before it)
``rank_step`` one worker's own view of a committed step (``potluck.metrics.observer``):
            ``rank``, ``world_size``, ``generation``, ``worker``, ``host``, ``step``,
            ``compute_s``, ``wait_s``, ``comm_s``, ``step_s``, ``bytes``; ``samples?``,
            ``share?``, ``samples_per_s?``, ``loss?`` (``docs/status.md``)
``done``    the loop ended: ``steps`` committed; ``redone?``, ``left?``, ``rank?``,
            ``generation?``, ``workers?``, ``n_params?``, ``sample?``
==========  ==============================================================================

``Journal`` appends each record with one ``O_APPEND`` ``os.write``: processes sharing a
file never interleave inside a line, and a SIGKILL leaves at worst a final line without
its newline, which ``read_journal`` and ``JournalFollower`` skip.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

KINDS = ("hello", "member", "joined", "step", "redo", "event", "held", "waited", "kill",
         "done", "rank_step")
RESERVED = ("kind", "time", "pid")


def make_record(kind: str, fields: dict[str, Any], *, pid: int,
                at: float) -> dict[str, Any]:
    """The record ``Journal.write`` would write (pure): reserved keys first."""
    if kind not in KINDS:
        raise ValueError(f"journal record kind {kind!r} is not one of {', '.join(KINDS)}; "
                         "add it to potluck.metrics.journal (KINDS and the table)")
    clash = sorted(set(fields) & set(RESERVED))
    if clash:
        raise ValueError(f"journal record fields {clash} are set by the journal itself; "
                         "rename them")
    record = {"kind": kind, "time": at, "pid": pid, **fields}
    return {key: _finite_or_none(value) for key, value in record.items()}


class Journal:
    """Appends records to ``path`` (its directory is created; ``truncate`` empties it)."""

    def __init__(self, path: str | Path, *, truncate: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_TRUNC if truncate else 0)
        self._fd: int | None = os.open(self.path, flags, 0o644)
        self.pid = os.getpid()

    def write(self, kind: str, *, at: float | None = None, **fields: Any) -> dict[str, Any]:
        """Append one record as a single write and return it; ``time`` is now, or ``at``
        for a record copied from another journal (the time it happened)."""
        if self._fd is None:
            raise ValueError(f"the journal {self.path} is closed; open a new Journal")
        record = make_record(kind, fields, pid=self.pid, at=time.time() if at is None else at)
        line = (json.dumps(record, allow_nan=False) + "\n").encode()
        # One write of the whole line: O_APPEND places it atomically at the end.
        if os.write(self._fd, line) != len(line):
            raise OSError(f"short write to the journal {self.path} (disk full?)")
        return record

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def read_journal(paths: str | Path | Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every complete record of the journal(s), file by file in the order given.

    A missing file has no records yet; a final line without its newline (being written,
    or torn by a kill) is skipped. A bad complete line raises ``ValueError``.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    records: list[dict[str, Any]] = []
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            continue
        records.extend(_parse(data[: data.rfind(b"\n") + 1], Path(path)))
    return records


class JournalFollower:
    """The new complete records of every ``*.jsonl`` in a directory, at each ``poll``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._offsets: dict[Path, int] = {}

    def poll(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        for path in sorted(self.directory.glob("*.jsonl")):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as file:
                file.seek(offset)
                chunk = file.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
            self._offsets[path] = offset + len(complete)
            records.extend(_parse(complete, path))
        return records


def _parse(complete: bytes, path: Path) -> list[dict[str, Any]]:
    records = []
    for line in complete.splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as exc:
            raise ValueError(f"{path}: the complete line {line[:80]!r} is not a JSON record "
                             f"({exc}); journals are written by potluck.metrics.journal."
                             "Journal only") from exc
    return records


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
