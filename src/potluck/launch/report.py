"""The failure report: which worker failed first, how, and its own traceback.

A worker started by ``potluck run`` writes an uncaught exception to its error file
(``write_error_file``); the agent reads it back (``read_error_file``) and picks the root
cause: the earliest failure by the time the worker recorded, or by the time the agent
saw the exit when no record exists. Workers the agent stopped itself are never the root
cause unless they had already recorded an exception of their own (the agent stops a
worker whose traceback is still printing when another's exit is seen first). Neither is
a worker whose script ran to its end (the bootstrap records that with
``write_finished_file``) and which then died while the interpreter shut down: its
training is complete, so the agent only warns (``format_teardown_warning``). Everything
here is pure except the file functions.

A potluck error (``PotluckError``: a refusal, a lost peer) says in its message what to
fix, so its report is one line, once for every rank that raised it (``ranks 0-3``),
without the traceback (``brief_error``); any other exception is reported with the
traceback of the first rank that raised it.
"""

from __future__ import annotations

import json
import signal
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from potluck.errors import CommHookError, PotluckError


@dataclass(frozen=True)
class ErrorRecord:
    """An uncaught exception as the worker recorded it."""

    timestamp: float
    exc_type: str
    message: str
    traceback: str
    brief: bool = False
    """A potluck error whose message is the whole story: reported without its traceback."""

    def same_as(self, other: ErrorRecord) -> bool:
        return (self.exc_type, self.message) == (other.exc_type, other.message)


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


def brief_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of potluck's own errors, whose message says the bad value,
    the rule and the fix: one line is enough. Not a ``CommHookError``: the traceback of
    its cause is the user's hook failing."""
    return isinstance(exc, PotluckError) and not isinstance(exc, CommHookError)


def write_error_file(path: str, exc: BaseException) -> None:
    record = {
        "timestamp": time.time(),
        "exc_type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
        "brief": brief_error(exc),
    }
    Path(path).write_text(json.dumps(record))


def read_error_file(path: str) -> ErrorRecord | None:
    try:
        data = json.loads(Path(path).read_text())
        return ErrorRecord(
            float(data["timestamp"]), str(data["exc_type"]), str(data["message"]),
            str(data["traceback"]), bool(data.get("brief", False)),
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


# What Gloo says, as a plain RuntimeError, when the process at the other end of a
# connection died (a kill -9): a lost peer all the same.
GLOO_PEER_GONE = ("Connection closed by peer", "Connection reset by peer")


def lost_a_peer(result: WorkerResult) -> bool:
    error = result.error
    if error is None:
        return False
    return error.exc_type in PEER_LOSS or (
        error.exc_type == "RuntimeError" and any(s in error.message for s in GLOO_PEER_GONE))


def root_cause(results: list[WorkerResult]) -> WorkerResult | None:
    """The first failure of its own: the earliest recorded exception that is not a lost
    peer (also from a worker the agent stopped, if it raised before the agent saw any
    failure: it was only stopped while its own traceback printed), else the earliest
    observed exit. When every failure only lost a peer: a worker whose script ended
    before the agent saw the first of them exit (it left while the others still needed
    it, e.g. it skipped a step's backward() and returned), else the first of them."""
    failed = [r for r in results if r.failed]
    if not failed:
        return None
    first_seen = min(r.seen_at for r in failed)
    own = [r for r in results if raised_its_own(r, first_seen)]
    if own:
        return min(own, key=_failed_at)
    first = min(failed, key=_failed_at)
    left = [r for r in results if left_early(r, first_seen)]
    return min(left, key=lambda r: (r.finished_at, r.rank)) if left else first


def raised_its_own(result: WorkerResult, first_seen: float) -> bool:
    """It failed, and not only by losing a peer; or the agent stopped it after it had
    recorded an exception of its own, before the agent saw the first failure."""
    if lost_a_peer(result) or result.finished_at is not None:
        return False
    if result.failed:
        return True
    return (result.stopped and result.error is not None
            and result.error.timestamp <= first_seen)


def _failed_at(result: WorkerResult) -> tuple[float, int]:
    return (result.error.timestamp if result.error else result.seen_at, result.rank)


def left_early(result: WorkerResult, before: float) -> bool:
    """Its script ended (exit 0) before ``before``, the time the agent saw the first
    lost peer's exit, while the others still needed it (the agent may have stopped the
    process since, in its interpreter's teardown). Not the lost peer's recorded time:
    a script that ends with ``cohort.close()`` closes its group first, so the others
    record their loss while it is still returning from ``close()``."""
    return result.finished_at is not None and result.finished_at <= before


def describe_exit(exitcode: int) -> str:
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    return f"killed by {name} (exit code {exitcode})"


def describe_error(error: ErrorRecord, exitcode: int) -> str:
    """The recorded exception; a script's own ``sys.exit(N)`` in words (its message is
    only the code, or the text that ``sys.exit("...")`` printed)."""
    if error.exc_type != "SystemExit":
        return f"{error.exc_type}: {error.message}"
    code = exitcode if exitcode > 0 else error.message
    number = error.message.lstrip("-").isdigit()
    called = f"sys.exit({error.message if number else repr(error.message)})"
    return f"the script exited with code {code} via SystemExit ({called})"


def rank_ranges(ranks: Iterable[int]) -> str:
    """``rank 2``, ``ranks 0-3``, ``ranks 0-1, 3``: ranks in runs."""
    ordered = sorted(set(ranks))
    runs: list[list[int]] = []
    for rank in ordered:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    text = ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)
    return f"rank {text}" if len(ordered) == 1 else f"ranks {text}"


def format_report(results: list[WorkerResult], *, host: str, node_rank: int,
                  title: str = "the job failed") -> str:
    """A human report of a failed attempt: the root cause first, then everyone else,
    those that ended alike on one line. A potluck error is one line for every rank
    that raised it (``brief_error``)."""
    root = root_cause(results)
    if root is not None and root.error is not None and root.error.brief \
            and root.why is None and root.finished_at is None:
        return _brief_report(root, root.error, results, host=host, node_rank=node_rank,
                             title=title)
    bar = "=" * 72
    lines = [bar, f"potluck run: {title}", bar]
    if root is None:
        lines.append("no worker failed on its own (every worker was stopped)")
    else:
        lines += _root_lines(root, host=host, node_rank=node_rank)
    lines += _other_lines([r for r in results if r is not root and r.exitcode != 0], root)
    lines.append(bar)
    return "\n".join(lines)


def _brief_report(root: WorkerResult, error: ErrorRecord, results: list[WorkerResult], *,
                  host: str, node_rank: int, title: str) -> str:
    """One line for the error and every rank that raised it, then the others."""
    raised = [r for r in results if r.error is not None and r.error.same_as(error)
              and (r.failed or r.stopped)]
    lines = [f"potluck run: {title}: {describe_error(error, root.exitcode)} "
             f"({rank_ranges(r.rank for r in raised)} on host {host}, node rank {node_rank})"]
    lines += _other_lines([r for r in results if r not in raised and r.exitcode != 0], root)
    return "\n".join(lines)


def _root_lines(root: WorkerResult, *, host: str, node_rank: int) -> list[str]:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(
        root.finished_at if not root.failed and root.finished_at is not None
        else _failed_at(root)[0]))
    lines = [
        "Root cause (first observed failure):",
        f"  rank      : {root.rank} (local rank {root.local_rank}, node rank {node_rank})",
        f"  host      : {host}",
        f"  pid       : {root.pid}",
        f"  time      : {when}",
        f"  exit      : {describe_exit(root.exitcode)}",
    ]
    if root.why is not None:
        lines.append(f"  why       : {root.why}")
    if root.stopped and root.finished_at is None:
        lines.append("  stopped   : by the launcher, after it raised the error below")
    if root.finished_at is not None:  # it left early: its script ended too soon
        lines.append("  why       : its script ended while the other ranks still "
                     "waited for it in a collective (they lost it as a peer): every "
                     "rank must run the same steps, and call backward() in each")
    if root.error is not None:
        lines.append(f"  error     : {describe_error(root.error, root.exitcode)}")
        if not root.error.brief:
            lines.append("  traceback :")
            lines += ["    " + line for line in root.error.traceback.rstrip().splitlines()]
    elif root.failed and root.exitcode > 0:
        lines.append(f"  traceback : none recorded (the process exited with code "
                     f"{root.exitcode} without an exception reaching potluck's worker "
                     "bootstrap: os._exit(), or native code)")
    elif root.failed:
        lines.append("  traceback : none recorded (the process died without raising)")
    return lines


def _other_lines(others: list[WorkerResult], root: WorkerResult | None) -> list[str]:
    """``Other workers:``, those that ended alike (and raised alike) on one line."""
    alike: dict[str, list[WorkerResult]] = {}
    for other in sorted(others, key=lambda r: r.rank):
        alike.setdefault(_how_it_ended(other, root), []).append(other)
    lines = ["Other workers:"] if alike else []
    for how, group in alike.items():
        pids = ", ".join(str(r.pid) for r in group)
        lines.append(f"  {rank_ranges(r.rank for r in group)} "
                     f"({'pid' if len(group) == 1 else 'pids'} {pids}): {how}")
    return lines


def _how_it_ended(other: WorkerResult, root: WorkerResult | None) -> str:
    how = "stopped by the launcher" if other.stopped else describe_exit(other.exitcode)
    if other.died_after_finishing:
        how = f"finished its script, then {how} at interpreter exit"
    if other.error is None:
        return how
    if root is not None and root.error is not None and other.error.same_as(root.error):
        return f"{how}: the same {other.error.exc_type}"
    return f"{how}: {describe_error(other.error, other.exitcode)}"


def format_teardown_warning(result: WorkerResult, *, host: str, node_rank: int) -> str:
    """The warning for a worker that completed its script and then died at exit."""
    return (
        f"potluck run: WARNING: rank {result.rank} (local rank {result.local_rank}, node "
        f"rank {node_rank}, host {host}, pid {result.pid}) finished its script, then died "
        f"at interpreter exit: {describe_exit(result.exitcode)}. Its script had completed, "
        "so it counts as finished and is not restarted; the crash came from tearing the "
        "process down (a library's threads or destructors), not from training"
    )
