"""The agents' side of the job's ``TCPStore``: node 0 hosts it, the other nodes wait.

The store lives in the agent of node rank 0, not in a worker, so a worker's death never
takes the rendezvous with it. Agents also meet on it: once per attempt (so every node
starts the same attempt together) and once at the end (so node 0 keeps the store up
until every node's workers are done with it). Waits poll in short slices so that a
signal to the launcher is handled within a fraction of a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

from torch._C._distributed_c10d import Store, TCPStore

from potluck import keys
from potluck.errors import ConfigError, RendezvousError
from potluck.launch.config import LaunchConfig

_SLICE = 2.0  # seconds per connection try, so signals are seen between tries


def host_store(config: LaunchConfig) -> TCPStore:
    """Node 0: the store server, on ``--master-port`` (or a free port)."""
    port = config.port_to_host()
    try:
        return TCPStore(
            "0.0.0.0", port, None, True, timedelta(seconds=config.join_timeout),
            wait_for_workers=False,
        )
    except RuntimeError as exc:
        raise ConfigError(
            f"cannot host the store on port {port}: {_first_line(exc)}; another program "
            "(or an earlier job) holds it: pick a free --master-port, or leave it out on "
            "a single node and potluck picks one"
        ) from exc


def join_store(config: LaunchConfig, stopping: Callable[[], bool]) -> TCPStore:
    """Other nodes: connect to node 0's store, retrying until the join timeout."""
    port = config.port_to_host()
    deadline = time.monotonic() + config.join_timeout
    last = ""
    while time.monotonic() < deadline and not stopping():
        try:
            return TCPStore(
                config.master_addr, port, None, False, timedelta(seconds=_SLICE),
                wait_for_workers=False,
            )
        except RuntimeError as exc:
            last = _first_line(exc)
    raise RendezvousError(
        f"node {config.node_rank} could not reach the store at {config.master_addr}:{port} "
        f"within {config.join_timeout:g} s ({last or 'stopped'}); start node 0's "
        "`potluck run` with the same --master-port, and check that --master-addr is "
        "node 0's address as this node sees it"
    )


def meet(
    store: Store,
    key: str,
    count: int,
    timeout: float,
    stopping: Callable[[], bool],
) -> None:
    """Count this agent in at ``key``; return when ``count`` agents have, else raise."""
    check_in(store, key)
    wait_for_count(store, key, lambda: count, timeout, stopping,
                   fix="start `potluck run` on every node with the same --nnodes, "
                       "--master-addr, --master-port and --run-id")


def check_in(store: Store, key: str) -> None:
    """Count this agent in at ``key`` without waiting for the others."""
    _count(store, key, 1)


def wait_for_count(store: Store, key: str, target: Callable[[], int], timeout: float,
                   stopping: Callable[[], bool], *,
                   fix: str = "a node's workers are still running or its agent hangs: "
                              "see that node's output") -> None:
    """Wait until ``key``'s count reaches ``target()`` (re-read: it may grow), or raise
    naming ``fix``."""
    deadline = time.monotonic() + timeout
    while (arrived := _count(store, key)) < (wanted := target()):
        if stopping():
            return
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"only {arrived} of {wanted} node agents reached {key!r} within "
                f"{timeout:g} s; {fix}"
            )
        time.sleep(0.05)


def count(store: Store, key: str) -> int:
    """The count at ``key`` (0 if nobody checked in yet)."""
    return _count(store, key)


def _count(store: Store, key: str, add: int = 0) -> int:
    try:
        return int(store.add(key, add))
    except RuntimeError as exc:
        raise RendezvousError(
            f"lost the store while waiting at {key!r} ({_first_line(exc)}); node 0's "
            "`potluck run` exited or the network to it failed: see node 0's report"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def mark_exited(store: Store, run_id: str, pid: int) -> None:
    """The agent saw worker process ``pid`` die: count it out of the elastic cohort now.

    Its member id (written by the worker under ``keys.process``) gets a leave key, so the
    survivors' next generation forms without waiting for its heartbeat to go stale. A
    process that never joined (or a static job) is ignored.
    """
    key = keys.process(run_id, pid)
    if store.check([key]):
        worker_id = store.get(key).decode()
        store.set(f"{keys.rendezvous_root(run_id)}/{keys.leave(worker_id)}", "exited")
