"""The failure report: which worker failed first, how, and its own traceback.

A worker started by ``potluck run`` writes an uncaught exception to its error file
(``write_error_file``); the agent reads it back (``read_error_file``) and picks the root
cause: the earliest failure by the time the worker recorded, or by the time the agent
saw the exit when no record exists. Workers the agent stopped itself are never the root
cause, and neither is a worker whose script ran to its end (the bootstrap records that
with ``write_finished_file``) and which then died while the interpreter shut down: its
training is complete, so the agent only warns (``format_teardown_warning``). Everything
here is pure except the file functions.
"""

from __future__ import annotations

import json
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ErrorRecord:
    """An uncaught exception as the worker recorded it."""

    timestamp: float
    exc_type: str
    message: str
    traceback: str


@dataclass(frozen=True)
class WorkerResult:
    """How one worker ended."""

    rank: int
    local_rank: int
    pid: int
    exitcode: int
    """The process's return code: negative for a signal (as ``subprocess`` gives it)."""
    seen_at: float
    """Wall-clock time the agent observed the exit."""
    stopped: bool = False
    """The agent stopped it (after another failure or a signal); not a root cause."""
    error: ErrorRecord | None = None
    finished_at: float | None = None
    """When its script ran to the end, if it did (recorded by the worker bootstrap)."""
    why: str | None = None
    """Why the agent ended it while it ran (elastic: the cohort went on without it)."""

    @property
    def failed(self) -> bool:
        return self.exitcode != 0 and not self.stopped and self.finished_at is None

    @property
    def died_after_finishing(self) -> bool:
        """Its script completed, then the process died at interpreter exit."""
        return self.exitcode != 0 and not self.stopped and self.finished_at is not None


def write_error_file(path: str, exc: BaseException) -> None:
    record = {
        "timestamp": time.time(),
        "exc_type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }
    Path(path).write_text(json.dumps(record))


def read_error_file(path: str) -> ErrorRecord | None:
    try:
        data = json.loads(Path(path).read_text())
        return ErrorRecord(
            float(data["timestamp"]), str(data["exc_type"]), str(data["message"]),
            str(data["traceback"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_finished_file(path: str) -> None:
    Path(path).write_text(repr(time.time()))


def read_finished_file(path: str) -> float | None:
    """When the worker's script ran to its end, or None if it never did."""
    try:
        return float(Path(path).read_text())
    except (OSError, ValueError):
        return None


def stop_file(finished_file: str) -> str:
    """Where a worker records a planned stop below ``--min-workers``, beside its finished
    file: the exit code alone (3) could be any script's own ``sys.exit(3)``."""
    return finished_file + ".below-minimum"


def write_stop_file(finished_file: str) -> None:
    Path(stop_file(finished_file)).write_text(repr(time.time()))


def stopped_below_minimum(finished_file: str) -> bool:
    return Path(stop_file(finished_file)).is_file()


# Exceptions that say "a peer went away", not why: a consequence, never the root cause
# while a worker that failed (or left) on its own is there to name.
PEER_LOSS = frozenset({"PeerLostError", "CommunicationError", "DistNetworkError",
                       "DistBackendError", "DistError"})


def lost_a_peer(result: WorkerResult) -> bool:
    return result.error is not None and result.error.exc_type in PEER_LOSS


def root_cause(results: list[WorkerResult]) -> WorkerResult | None:
    """The first failure of its own (earliest recorded exception, else earliest observed
    exit). When every failure only lost a peer: a worker whose script ended before the
    first of them (it left while the others still needed it, e.g. it skipped a step's
    backward() and returned), else the first of them."""
    failed = [r for r in results if r.failed]
    if not failed:
        return None
    own = [r for r in failed if not lost_a_peer(r)]
    if own:
        return min(own, key=_failed_at)
    first = min(failed, key=_failed_at)
    assert first.error is not None  # lost_a_peer
    left = [r for r in results if left_early(r, first.error.timestamp)]
    return min(left, key=lambda r: (r.finished_at, r.rank)) if left else first


def _failed_at(result: WorkerResult) -> tuple[float, int]:
    return (result.error.timestamp if result.error else result.seen_at, result.rank)


def left_early(result: WorkerResult, before: float) -> bool:
    """Its script ended (exit 0) before ``before``, while the others still needed it
    (the agent may have stopped the process since, in its interpreter's teardown)."""
    return result.finished_at is not None and result.finished_at <= before


def describe_exit(exitcode: int) -> str:
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    return f"killed by {name} (exit code {exitcode})"


def format_report(results: list[WorkerResult], *, host: str, node_rank: int,
                  title: str = "the job failed") -> str:
    """A human report of a failed attempt: the root cause first, then everyone else."""
    root = root_cause(results)
    bar = "=" * 72
    lines = [bar, f"potluck run: {title}", bar]
    if root is None:
        lines.append("no worker failed on its own (every worker was stopped)")
    else:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(
            root.finished_at if not root.failed and root.finished_at is not None
            else _failed_at(root)[0]))
        lines += [
            "Root cause (first observed failure):",
            f"  rank      : {root.rank} (local rank {root.local_rank}, node rank {node_rank})",
            f"  host      : {host}",
            f"  pid       : {root.pid}",
            f"  time      : {when}",
            f"  exit      : {describe_exit(root.exitcode)}",
        ]
        if root.why is not None:
            lines.append(f"  why       : {root.why}")
        if not root.failed:  # it left early: its script ended while the others needed it
            lines.append("  why       : its script ended while the other ranks still "
                         "waited for it in a collective (they lost it as a peer): every "
                         "rank must run the same steps, and call backward() in each")
        if root.error is not None:
            lines.append(f"  error     : {root.error.exc_type}: {root.error.message}")
            lines.append("  traceback :")
            lines += ["    " + line for line in root.error.traceback.rstrip().splitlines()]
        elif root.failed:
            lines.append("  traceback : none recorded (the process died without raising)")
    others = [r for r in results if r is not root and r.exitcode != 0]
    if others:
        lines.append("Other workers:")
    for other in sorted(others, key=lambda r: r.rank):
        how = "stopped by the launcher" if other.stopped else describe_exit(other.exitcode)
        if other.died_after_finishing:
            how = f"finished its script, then {how} at interpreter exit"
        error = f": {other.error.exc_type}: {other.error.message}" if other.error else ""
        lines.append(f"  rank {other.rank} (pid {other.pid}): {how}{error}")
    lines.append(bar)
    return "\n".join(lines)


def format_teardown_warning(result: WorkerResult, *, host: str, node_rank: int) -> str:
    """The warning for a worker that completed its script and then died at exit."""
    return (
        f"potluck run: WARNING: rank {result.rank} (local rank {result.local_rank}, node "
        f"rank {node_rank}, host {host}, pid {result.pid}) finished its script, then died "
        f"at interpreter exit: {describe_exit(result.exitcode)}. Its script had completed, "
        "so it counts as finished and is not restarted; the crash came from tearing the "
        "process down (a library's threads or destructors), not from training"
    )
