"""One membership generation's process group, and typed errors from its collectives.

Each generation gets a fresh backend object under its own store prefix (``keys.py``), so
keys of an earlier generation or an earlier restart never collide with the current one.
Static and elastic cohorts build their groups here alike, Gloo or NCCL. The group's timeout
bounds every collective: a dead peer fails the pending collective at once (its socket
closes), a frozen or cut-off one at the timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store

from potluck.errors import ConfigError, RendezvousError
from potluck.group import ProcessGroupLike, discard
from potluck.relay import for_c10d, prefixed

BACKENDS = ("gloo", "nccl")
POLL_S = 0.02  # how often a rank that built its group asks whether every peer has


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
               generation: int, abandoned: Callable[[], bool] | None = None
               ) -> ProcessGroupLike:
    """Create the backend object under ``prefix``; returns once every rank has built its
    own (``_all_built``), all within ``spec.timeout``. ``abandoned``: whether a peer gave
    up on this generation (its step-failed mark), which ends the wait at once. The group
    holds a c10d client of the store, never a relay (``relay.for_c10d``)."""
    deadline = time.monotonic() + spec.timeout
    group = _build(spec, store, prefix, rank, world_size, generation)
    try:
        _all_built(spec, store, prefix, rank, world_size, generation, deadline,
                   abandoned or (lambda: False))
    except BaseException:
        held = [group]
        del group
        discard(held, generation)  # the backend's threads are joined here, not left to a traceback
        raise
    return group


def _all_built(spec: GroupSpec, store: Store, prefix: str, rank: int, world_size: int,
               generation: int, deadline: float, abandoned: Callable[[], bool]) -> None:
    """Wait until every rank has its group. Gloo's mesh handshake can finish on one side
    of a pair before the other. A rank that returned and closed its group at once (a job
    that ends right after a recovery) cut its peer's handshake, and the peer then failed
    to build a group the others counted on."""
    marks = prefixed(store, prefix)
    marks.set(f"built/{rank}", "1")
    keys = [f"built/{r}" for r in range(world_size)]
    while not marks.check(keys):
        if abandoned():
            raise RendezvousError(
                f"rank {rank} of {world_size} built its {spec.backend} group of generation "
                f"{generation}, but a peer gave up on it (it could not build its own)")
        if time.monotonic() >= deadline:
            raise RendezvousError(
                f"rank {rank} of {world_size} built its {spec.backend} group of generation "
                f"{generation}, but not every peer did within {spec.timeout:g} s; a peer "
                "died or lost its link meanwhile: check every worker's log")
        time.sleep(POLL_S)


def _build(spec: GroupSpec, store: Store, prefix: str, rank: int, world_size: int,
           generation: int) -> ProcessGroupLike:
    """This rank's backend object; blocks until every rank connected to it."""
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
