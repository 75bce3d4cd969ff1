"""Agents meeting on the job's store: counting in at a key, waiting for the others'
count, and saying every few seconds what a wait is for.

An attempt of a static job starts when every node's agent has checked in
(``exchange_nprocs``); an elastic job's later node takes its launch ranks after node 0's
and those of every node that asked before it (``elastic_offset``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from potluck import keys
from potluck.errors import ConfigError, RendezvousError
from potluck.launch.config import LaunchConfig

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

Say = Callable[[str], None]

# A wait for node 0 or the other nodes says what it waits for: first after this many
# seconds (a healthy start is quicker), then every REPORT_EVERY seconds.
FIRST_REPORT = 5.0


REPORT_EVERY = 10.0


def waiting_for_nodes(node_rank: int, arrived: int, wanted: int, waited: float,
                      timeout: float) -> str:
    """What an agent says while the other nodes' agents have not all met it."""
    return (f"potluck run: node {node_rank} is waiting for the other nodes: {arrived} of "
            f"{wanted} node agents have met on the store ({waited:.0f} s of --join-timeout "
            f"{timeout:g} s): start `potluck run` on every node with the same --nnodes, "
            "--master-addr, --master-port and --run-id, and a --node-rank of its own")


def report_due(waited: float, said: int, *, first: float = FIRST_REPORT,
               every: float = REPORT_EVERY) -> bool:
    """Whether a wait of ``waited`` seconds that reported ``said`` times reports again:
    at ``first`` seconds, then every ``every`` seconds."""
    return waited >= first + said * every


class Reports:
    """A waiting loop's reports: each try calls it with the line to say, which is said
    when ``report_due`` (never when ``say`` is None)."""

    def __init__(self, say: Say | None) -> None:
        self._say, self._started, self._said = say, time.monotonic(), 0

    def __call__(self, line: Callable[[float], str]) -> None:
        waited = time.monotonic() - self._started
        if self._say is not None and report_due(waited, self._said, first=FIRST_REPORT,
                                                every=REPORT_EVERY):
            self._said += 1
            self._say(line(waited))


def meet(
    store: Store,
    key: str,
    count: int,
    timeout: float,
    stopping: Callable[[], bool],
    *,
    say: Say | None = None,
    node_rank: int = 0,
) -> None:
    """Count this agent in at ``key``; return when ``count`` agents have, else raise.
    ``say`` hears every few seconds how many have come (``waiting_for_nodes``)."""
    check_in(store, key)
    reports = Reports(say)

    def report(arrived: int, wanted: int) -> None:
        reports(lambda waited: waiting_for_nodes(node_rank, arrived, wanted, waited, timeout))

    wait_for_count(store, key, lambda: count, timeout, stopping, report=report,
                   fix="start `potluck run` on every node with the same --nnodes, "
                       "--master-addr, --master-port and --run-id")


def check_in(store: Store, key: str) -> None:
    """Count this agent in at ``key`` without waiting for the others."""
    bump(store, key, 1)


def wait_for_count(store: Store, key: str, target: Callable[[], int], timeout: float,
                   stopping: Callable[[], bool], *,
                   fix: str = "a node's workers are still running or its agent hangs: "
                              "see that node's output",
                   report: Callable[[int, int], None] = lambda arrived, wanted: None,
                   ) -> None:
    """Wait until ``key``'s count reaches ``target()`` (re-read: it may grow), or raise
    naming ``fix``; ``report(arrived, wanted)`` hears each look that fell short."""
    deadline = time.monotonic() + timeout
    while (arrived := bump(store, key)) < (wanted := target()):
        if stopping():
            return
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"only {arrived} of {wanted} node agents reached {key!r} within "
                f"{timeout:g} s; {fix}"
            )
        report(arrived, wanted)
        time.sleep(0.05)


def count(store: Store, key: str) -> int:
    """The count at ``key`` (0 if nobody checked in yet)."""
    return bump(store, key)


def bump(store: Store, key: str, add: int = 0) -> int:
    """The count at ``key`` after adding ``add`` (0: just read it); a lost store is one
    line naming the key."""
    try:
        return int(store.add(key, add))
    except RuntimeError as exc:
        raise RendezvousError(
            f"lost the store while waiting at {key!r} ({first_line(exc)}); node 0's "
            "`potluck run` exited or the network to it failed: see node 0's report"
        ) from exc


def exchange_nprocs(store: Store, key: str, config: LaunchConfig,
                    stopping: Callable[[], bool], *, say: Say | None = None) -> list[int]:
    """Meet the other nodes' agents at ``key`` (one attempt), each telling its worker
    count; returns every node's count in node rank order. Two agents started with the
    same ``--node-rank`` are refused at once (their ranks would collide). ``say`` hears
    every few seconds how many have come."""
    node = config.node_rank
    if bump(store, f"{key}/node{node}", 1) > 1:
        raise ConfigError(
            f"another node's `potluck run` already started with --node-rank {node} for "
            f"this job (--run-id {config.run_id}): give every node its own --node-rank, "
            f"0..{config.nnodes - 1}"
        )
    store.set(f"{key}/nproc{node}", str(config.nproc_per_node))
    meet(store, key, config.nnodes, config.join_timeout, stopping, say=say,
         node_rank=node)
    return [int(store.get(f"{key}/nproc{r}").decode()) for r in range(config.nnodes)]


def publish_first_node(store: Store, config: LaunchConfig) -> None:
    """Node 0 of an elastic job: its worker count, which its ranks 0.. occupy."""
    store.set(keys.agents(config.run_id, "nproc0"), str(config.nproc_per_node))


def elastic_offset(store: Store, config: LaunchConfig, stopping: Callable[[], bool], *,
                   say: Say | None = None) -> int:
    """A later node of an elastic job: the launch rank of its local rank 0, after node
    0's workers and every node that asked before it. A founding node (one of
    ``--nnodes MIN:MAX``'s first MIN) must run node 0's worker count: the cohort's first
    generation waits for exactly MIN nodes' worth of workers. ``say`` hears every few
    seconds that node 0 has not said its count yet."""
    key = keys.agents(config.run_id, "nproc0")
    deadline = time.monotonic() + config.join_timeout
    reports = Reports(say)
    try:
        while not store.check([key]):
            if stopping() or time.monotonic() > deadline:
                raise RendezvousError(f"node 0 did not say how many workers it runs within "
                                      f"{config.join_timeout:g} s; see node 0's output")
            reports(lambda waited: (
                f"potluck run: node {config.node_rank} reached node 0's store at "
                f"{config.master_addr} and is waiting for node 0 to start its workers "
                f"({waited:.0f} s of --join-timeout {config.join_timeout:g} s); see node "
                "0's output"))
            time.sleep(0.05)
        first = int(store.get(key).decode())
    except RuntimeError as exc:  # node 0 closed the store: its job ended, or it died
        raise RendezvousError(
            f"lost node 0's store at {config.master_addr} ({first_line(exc)}): node 0's "
            "`potluck run` exited (its job may have finished already) or the network to "
            "it failed; see node 0's output"
        ) from exc
    founding = config.min_nodes if config.min_nodes is not None else config.nnodes
    if config.node_rank < founding and first != config.nproc_per_node:
        raise ConfigError(
            f"--nproc-per-node {config.nproc_per_node} on node {config.node_rank}, but node "
            f"0 runs {first}: the {founding} founding node(s) of --nnodes "
            f"{founding}:{config.nnodes} must run the same number of workers (the first "
            "generation waits for that many); nodes that join later may run any number"
        )
    taken = bump(store, keys.agents(config.run_id, "slots"), config.nproc_per_node)
    from potluck.relay import succession_of  # (torch: not before the store is reached)

    succession = succession_of(store)
    if succession is not None:  # the store may move: what a later node reads goes too
        succession.seeder(lambda root: seed_layout(root, config.run_id, first, taken))
    return first + taken - config.nproc_per_node


def seed_layout(store: Store, run_id: str, first: int, taken: int) -> None:
    """The job's store moved (``potluck.succession``): write back what a node that joins
    later reads to number its workers (``elastic_offset``): node 0's worker count, and
    the slots taken, at least up to this node's. Without them a node that joined the
    moved store waited for node 0 to start its workers until its join timeout."""
    store.compare_set(keys.agents(run_id, "nproc0"), "", str(first))
    raise_count(store, keys.agents(run_id, "slots"), taken)


def raise_count(store: Store, key: str, at_least: int) -> int:
    """The count at ``key`` raised to at least ``at_least``, never lowered (on a moved
    store every survivor writes back its own); the count after."""
    have = int(store.add(key, 0))
    while have < at_least:
        have = int(store.compare_set(key, str(have), str(at_least)).decode())
    return have


def first_line(exc: BaseException) -> str:
    """An error's first line (c10d's carry a C++ stack trace after it)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
