"""What the agents read and write of the cohort's keys: a worker's place in it (joined,
exited, left out, admitted), whether the run finished, and the keys cleared before a
whole restart."""

from __future__ import annotations

from typing import TYPE_CHECKING

from potluck import keys
from potluck.launch.policy import CohortView

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

def clear_worker_keys(store: Store) -> int:
    """Delete every key of the store that is not potluck's (``potluck/...``, each named
    with its attempt where an attempt must not see another's): what a restarted
    attempt's plain torch workers would otherwise read. torch's ``env://`` rendezvous
    on the agent's store writes its group's keys with no attempt in them (torchrun
    gives every attempt a new store), so an attempt's Gloo group read the previous
    attempt's addresses and hung or failed. Node 0 calls it before an attempt's
    workers start on any node. Returns how many keys it deleted."""
    deleted = 0
    for key in store.list_keys():  # type: ignore[attr-defined]
        if not key.startswith("potluck/"):
            deleted += bool(store.delete_key(key))
    return deleted


def holds_torch_keys(store: Store) -> bool:
    """Whether a key that is not potluck's is on the store: a worker formed a plain
    torch.distributed group on it (torch's ``env://`` rendezvous with the agent's
    store writes its group's addresses there)."""
    return any(not key.startswith("potluck/")
               for key in store.list_keys())  # type: ignore[attr-defined]


def clear_for_whole_restart(store: Store, run_id: str) -> int:
    """Before an elastic job's whole worker set restarts (no cohort ever formed): delete
    every key its workers wrote, torch's (``clear_worker_keys``) and the cohort's
    (a half-joined rendezvous would hold the restarted workers waiting for a founder
    that is gone). The agents' and the status page's keys stay. Returns how many keys
    it deleted."""
    keep = (keys.agents(run_id, ""), keys.status_count(run_id).removesuffix("count"))
    deleted = 0
    for key in store.list_keys():  # type: ignore[attr-defined]
        if not key.startswith(keep):
            deleted += bool(store.delete_key(key))
    return deleted


def joined_cohort(store: Store, run_id: str, pid: int) -> bool:
    """Whether worker process ``pid`` joined the elastic cohort (``potluck.init()``
    writes its member id under ``keys.process``)."""
    return store.check([keys.process(run_id, pid)])


def cohort_formed(store: Store, run_id: str) -> bool:
    """Whether any generation of the elastic cohort was ever published."""
    return store.check([_rendezvous(run_id, keys.CURRENT)])


def mark_exited(store: Store, run_id: str, pid: int) -> None:
    """The agent saw worker process ``pid`` die: count it out of the elastic cohort now.

    Its member id (written by the worker under ``keys.process``) gets a leave key, so the
    survivors' next generation forms without waiting for its heartbeat to go stale. A
    process that never joined (or a static job) is ignored.
    """
    key = keys.process(run_id, pid)
    if store.check([key]):
        worker_id = store.get(key).decode()
        store.set(_rendezvous(run_id, keys.leave(worker_id)), "exited")


def view_worker(store: Store, run_id: str, pid: int, worker_id: str | None) -> CohortView:
    """What the store says about elastic worker process ``pid`` (``worker_id``: its id if
    already known, which saves a read)."""
    if worker_id is None:
        key = keys.process(run_id, pid)
        if not store.check([key]):
            return CohortView(None)
        worker_id = store.get(key).decode()
    verdict = _rendezvous(run_id, keys.verdict(worker_id))
    return CohortView(
        worker_id,
        left_out=store.check([_rendezvous(run_id, keys.left_out(worker_id))]),
        left=store.check([_rendezvous(run_id, keys.leave(worker_id))]),
        admitted=store.check([verdict]) and store.get(verdict).decode().startswith(keys.ADMITTED),
    )


def run_finished(store: Store, run_id: str) -> bool:
    return store.check([_rendezvous(run_id, keys.FINISHED)])


def _rendezvous(run_id: str, key: str) -> str:
    """A rendezvous key (``keys``, relative to its prefix) as the agents' store has it."""
    return f"{keys.rendezvous_root(run_id)}/{key}"
