"""One membership generation's process group, and typed errors from its collectives.

Each generation gets a fresh backend object under its own store prefix (``keys.py``), so
keys of an earlier generation or an earlier restart never collide with the current one.
Static and elastic cohorts build their groups here alike, Gloo or NCCL. The group's timeout
bounds every collective: a dead peer fails the pending collective at once (its socket
closes), a frozen or cut-off one at the timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store

from potluck.errors import ConfigError, RendezvousError
from potluck.group import ProcessGroupLike
from potluck.relay import for_c10d, prefixed

log = logging.getLogger(__name__)

BACKENDS = ("gloo", "nccl")
POLL_S = 0.02  # how often a closing rank asks whether every peer has built


def choose_backend(requested: str | None) -> str:
    """``requested`` if valid, else NCCL where CUDA is available and Gloo otherwise."""
    if requested is None:
        return "nccl" if torch.cuda.is_available() else "gloo"
    backend = requested.lower()
    if backend not in BACKENDS:
        raise ConfigError(f"backend={requested!r} is not one of {BACKENDS}; pass one or None")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ConfigError(
            "backend='nccl' needs CUDA, which this process cannot see; use backend='gloo' "
            "or None (chooses Gloo on CPU)"
        )
    return backend


@dataclass(frozen=True)
class GroupSpec:
    """How this worker builds every generation's group (the same for all generations)."""

    backend: str
    timeout: float
    host: str  # the address Gloo binds to (what peers can dial)
    ifname: str | None = None  # GLOO_SOCKET_IFNAME, if set


def make_group(spec: GroupSpec, store: Store, prefix: str, rank: int, world_size: int,
               generation: int) -> ProcessGroupLike:
    """Create the backend object under ``prefix``; blocks until every rank connected to
    this one, then marks it built (``peers_built``). The group holds a c10d client of
    the store, never a relay (``relay.for_c10d``)."""
    group = _build(spec, store, prefix, rank, world_size, generation)
    try:
        prefixed(store, prefix).set(f"built/{rank}", "1")
    except RuntimeError as exc:  # (a store error: the group is built all the same)
        log.info("rank %d could not mark its group of generation %d built (%s); a peer "
                 "that closes at once waits its timeout", rank, generation, exc)
    return group


def peers_built(store: Store, prefix: str, world_size: int, deadline: float,
                abandoned: Callable[[], bool]) -> bool:
    """Wait until every rank of the group under ``prefix`` has built its own, a peer
    gave up on the generation (``abandoned``), or ``deadline`` (checked between store
    reads: a read on a cut link may outlast it); True if all built.

    Gloo's mesh handshake can finish on one side of a pair first. A rank that closes
    its group before any collective (a job ending right after a recovery) would cut a
    peer's handshake, and that peer would fail to build a group the others counted on.
    A rank that closes such a group waits here first; a collective through the group
    implies every peer built, so nothing else waits."""
    marks = prefixed(store, prefix)
    keys = [f"built/{r}" for r in range(world_size)]
    while not marks.check(keys):
        if abandoned() or time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def _build(spec: GroupSpec, store: Store, prefix: str, rank: int, world_size: int,
           generation: int) -> ProcessGroupLike:
    under = PrefixStore(prefix, for_c10d(store))
    delta = timedelta(seconds=spec.timeout)
    try:
        if spec.backend == "nccl":
            nccl: Any = dist.ProcessGroupNCCL
            nccl_opts = nccl.Options()
            nccl_opts._timeout = delta
            group: ProcessGroupLike = nccl(under, rank, world_size, nccl_opts)
            return group
        # torch's stubs lag the bindings: the options class is ``_Options`` at runtime.
        gloo: Any = dist.ProcessGroupGloo
        gloo_opts = gloo._Options()
        gloo_opts._timeout = delta
        gloo_opts._devices = [_gloo_device(spec)]
        group = gloo(under, rank, world_size, gloo_opts)
        return group
    except RuntimeError as exc:
        raise RendezvousError(
            f"rank {rank} of {world_size} could not build the {spec.backend} group of "
            f"generation {generation} within {spec.timeout:g} s ({exc}); a peer did not "
            "start, died meanwhile, or cannot reach this host: check every worker's log "
            "and the network between the nodes (set GLOO_SOCKET_IFNAME to pick the "
            "interface)"
        ) from exc


def _gloo_device(spec: GroupSpec) -> Any:
    if spec.ifname:
        return dist.ProcessGroupGloo.create_device(interface=spec.ifname)
    return dist.ProcessGroupGloo.create_device(hostname=spec.host)
