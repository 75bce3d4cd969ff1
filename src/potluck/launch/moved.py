"""A node 0 started again must not host a second store for a job whose store moved.

When node 0 is lost, the store moves to another node's agent (``potluck.succession``)
and the cohort goes on there. Node 0's command, run again, would host a new, empty
store on ``--master-port`` and its workers would found a cohort of their own: two
cohorts training one job. So each agent of a multi-node elastic job keeps, on its own
machine, the successor addresses it learned (``remember``: a small file under
``~/.cache/potluck``, by run id), and node 0's agent, before it hosts anything, looks
for a live store at them (``moved_to``). Found, it refuses to start and says how to
join that store as a late node instead. The file goes when the job ends well.
"""

from __future__ import annotations

import contextlib
import json
import os
from datetime import timedelta
from pathlib import Path

from potluck import keys
from potluck.succession import Candidate, reachable

PROBE_S = 2.0  # seconds for a remembered candidate to answer


def _path(run_id: str) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
    return root / "potluck" / "successors" / f"{safe}.json"


def remember(run_id: str, candidates: list[Candidate]) -> None:
    """Keep this job's successor addresses on this machine (best effort)."""
    path = _path(run_id)
    with contextlib.suppress(OSError):  # (a read-only home: the guard is lost, not the job)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps([c.encode() for c in candidates]))
        temporary.replace(path)


def forget(run_id: str) -> None:
    """The job ended well: nothing to guard."""
    with contextlib.suppress(OSError):
        _path(run_id).unlink(missing_ok=True)


def remembered(run_id: str) -> list[Candidate]:
    """The successor addresses kept for ``run_id`` (none: never a multi-node job here)."""
    try:
        return [Candidate.decode(raw) for raw in json.loads(_path(run_id).read_text())]
    except (OSError, ValueError, TypeError):
        return []


def moved_to(run_id: str, node: int) -> Candidate | None:
    """A remembered candidate of another node whose store holds this job's cohort (it
    has a current generation): where the store moved. None: no such live store."""
    candidates = remembered(run_id)
    if not candidates:
        return None  # (the usual case: no torch import before the workers start)
    from torch._C._distributed_c10d import TCPStore

    current = f"{keys.rendezvous_root(run_id)}/{keys.CURRENT}"
    for candidate in candidates:
        if candidate.node == node or not reachable(candidate, PROBE_S):
            continue
        try:
            store = TCPStore(candidate.host, candidate.port, is_master=False,
                             timeout=timedelta(seconds=PROBE_S))
            if store.check([current]):
                return candidate
        except RuntimeError:  # (not serving: its agent never took the store)
            continue
    return None
