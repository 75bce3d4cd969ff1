"""One membership generation's process group, and typed errors from its collectives.

Each generation gets a fresh backend object under its own store prefix
(``potluck/<run>/a<attempt>/g<generation>``), so keys of an earlier generation or an
earlier restart of the job never collide with the current one. The group's timeout
bounds every collective: a dead peer fails the pending collective at once (its socket
closes), a frozen or cut-off one at the timeout.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store

from potluck.env import WorkerEnv
from potluck.errors import ConfigError, PeerLostError, RendezvousError

BACKENDS = ("gloo", "nccl")


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


def store_prefix(env: WorkerEnv, generation: int) -> str:
    return f"potluck/{env.run_id}/a{env.restart_count}/g{generation}"


def make_group(
    backend: str,
    store: Store,
    env: WorkerEnv,
    generation: int,
    timeout: float,
    host: str,
) -> Any:
    """Create the backend object; blocks until every rank of ``env`` has connected."""
    prefixed = PrefixStore(store_prefix(env, generation), store)
    delta = timedelta(seconds=timeout)
    try:
        if backend == "nccl":
            nccl: Any = dist.ProcessGroupNCCL
            nccl_opts = nccl.Options()
            nccl_opts._timeout = delta
            return nccl(prefixed, env.rank, env.world_size, nccl_opts)
        # torch's stubs lag the bindings: the options class is ``_Options`` at runtime.
        gloo: Any = dist.ProcessGroupGloo
        gloo_opts = gloo._Options()
        gloo_opts._timeout = delta
        gloo_opts._devices = [_gloo_device(env, host)]
        return gloo(prefixed, env.rank, env.world_size, gloo_opts)
    except RuntimeError as exc:
        raise RendezvousError(
            f"rank {env.rank} of {env.world_size} could not build the {backend} group of "
            f"generation {generation} within {timeout:g} s ({exc}); a peer did not start "
            "or cannot reach this host: check every worker's log and the network between "
            "the nodes (set GLOO_SOCKET_IFNAME to pick the interface)"
        ) from exc


def _gloo_device(env: WorkerEnv, host: str) -> Any:
    if env.gloo_ifname:
        return dist.ProcessGroupGloo.create_device(interface=env.gloo_ifname)
    return dist.ProcessGroupGloo.create_device(hostname=host)


def wait_collective(work: Any, *, rank: int, generation: int, what: str) -> Any:
    """Wait for ``work`` (a c10d Work or Future); a failure becomes ``PeerLostError``."""
    try:
        return work.wait()
    except RuntimeError as exc:
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        kind = "timed out" if "timed out" in cause.lower() or "timeout" in cause.lower() \
            else "failed"
        raise PeerLostError(
            f"{what} {kind} on rank {rank} in generation {generation}: a peer died, froze "
            f"or was cut off ({cause}); the step's collectives are void: rebuild the "
            "cohort or restart the job (potluck run --max-restarts K)",
            rank=rank, generation=generation, cause=str(exc),
        ) from exc
