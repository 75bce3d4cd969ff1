"""``potluck.init()``: join the job this process was started in, fixed or elastic.

What the launcher says decides the mode. Under ``potluck run --elastic`` (token, agent
store) the worker joins the elastic cohort as a new member with a fresh id (host, pid,
nonce), so a restarted worker is admitted at a step boundary and receives the live
state; its agent reports its death under ``keys.process``. Otherwise (``potluck run``,
torchrun, SLURM, or a plain process) the launcher's ranks form one fixed generation.
``join_elastic`` is the same join on a store the caller holds (tests, the chaos bench).
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import socket
from collections.abc import Callable
from datetime import timedelta

import torch
from torch._C._distributed_c10d import Store, TCPStore

from potluck import keys
from potluck.cohort.cohort import Cohort
from potluck.cohort.current import set_current
from potluck.cohort.groups import GroupSpec, choose_backend
from potluck.cohort.membership import FixedMembership, RendezvousMembership
from potluck.cohort.store import connect_store, local_address
from potluck.env import WorkerEnv, read_worker_env
from potluck.errors import ConfigError, RendezvousError
from potluck.etcd_store import EtcdStore, job_prefix
from potluck.relay import RelayStore, succession_of
from potluck.rendezvous import RendezvousConfig
from potluck.succession import Succession

log = logging.getLogger(__name__)


def init(*, timeout: float = 60.0, backend: str | None = None,
         env: WorkerEnv | None = None, heartbeat_interval: float = 0.5,
         heartbeat_timeout: float = 3.0, settle_timeout: float = 30.0,
         join_timeout: float = 300.0, device: str | None = None) -> Cohort:
    """Join the job this process was started in (potluck run, torchrun, SLURM, or none).

    ``timeout`` (seconds) bounds joining and every collective. Without launcher
    variables this is a one-process cohort. The heartbeat and rendezvous timeouts apply
    to elastic jobs only. ``env`` overrides what the environment says (tests). The
    cohort is the process's current one (``potluck.cohort.current``) until it is closed.
    ``device``: ``"cuda"`` keeps a Gloo cohort's tensors on this worker's GPU (NCCL
    always does; by default Gloo keeps them on the CPU).
    """
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not timeout > 0):
        raise ConfigError(f"timeout={timeout!r} must be a positive number of seconds, e.g. 60")
    env = read_worker_env() if env is None else env
    chosen = choose_backend(backend)
    placed = _device(chosen, env, device)
    host = local_address(env) if env.distributed or env.elastic else "127.0.0.1"
    spec = GroupSpec(chosen, timeout, host, env.gloo_ifname)
    if env.elastic:
        config = RendezvousConfig(
            token=_token(env), expected=env.founders or env.world_size,
            heartbeat_interval=heartbeat_interval, heartbeat_timeout=heartbeat_timeout,
            settle_timeout=settle_timeout, join_timeout=join_timeout,
            max_size=env.cohort_size,
            prefix=keys.rendezvous_root(env.run_id), quorum=env.num_nodes > 1)
        store = _agent_store(env, timeout)
        worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        named = _ProcessKey(store, keys.process(env.run_id, os.getpid()))
        named(worker_id)
        # A restarted worker keeps its seat (host, node, local rank), not its id.
        seat = f"{socket.gethostname()}:node{env.node_rank}:local{env.local_rank}"
        cohort = join_elastic(store, worker_id, config, spec, keys.elastic_root(env.run_id),
                              device=placed, env=env, seat=seat, named=named)
    else:
        store = connect_store(env, timeout)
        session = _session()
        cohort = Cohort(FixedMembership(env.rank, env.world_size), store, spec,
                        lambda g: keys.static_group(env.run_id, env.restart_count, g, session),
                        device=placed, env=env)
    log.info("[rank %d] joined: %r", cohort.rank, cohort)
    set_current(cohort)  # the defaults of CheckpointManager and DistributedRng follow it
    return cohort


def _session() -> int:
    """Which cohort of this process this ``init()`` forms: 0, then 1 after it closed
    its first and called ``init()`` again (a second training stage), so the new group's
    keys are not the closed one's on a store that outlives it (the launcher's): a Gloo
    group reading those found addresses nobody listens at. Counted in the process:
    every rank of a job runs the same script, so its k-th ``init()`` is every rank's
    k-th (a count on the store would not be, where a group forms lazily, as NCCL's)."""
    return next(_INITS)


_INITS = itertools.count()  # static cohorts this process has formed


def join_elastic(store: Store, worker_id: str, config: RendezvousConfig, spec: GroupSpec,
                 root: str = "potluck/elastic", *, device: torch.device | None = None,
                 env: WorkerEnv | None = None, seat: str | None = None,
                 named: Callable[[str], None] = lambda worker_id: None) -> Cohort:
    """Join (or found) the elastic cohort that meets on ``store`` under ``root``;
    ``seat``: where it runs (a quarantined member's seat is refused; default its id);
    ``named(id)`` hears each new id a joiner takes when it rejoins."""
    membership = RendezvousMembership(store, worker_id, config, root, seat, named)
    return Cohort(membership, store, spec, lambda g: keys.elastic_group(root, g),
                  device=device, env=env)


class _ProcessKey:
    """The agent that started this process reports its death under ``keys.process``:
    the key names the worker's current id (a joiner that rejoins takes a new one). It
    is written again on a store that moved."""

    def __init__(self, store: Store, key: str) -> None:
        self._store, self._key, self._id = store, key, ""
        succession = succession_of(store)
        if succession is not None:
            succession.seeder(lambda root: root.set(self._key, self._id))

    def __call__(self, worker_id: str) -> None:
        self._id = worker_id
        self._store.set(self._key, worker_id)


def _token(env: WorkerEnv) -> str:
    if not env.token:
        raise ConfigError(
            "elastic training needs the job's shared secret: pass --token SECRET to "
            "`potluck run` (every worker must hold it to be admitted)"
        )
    return env.token


def _agent_store(env: WorkerEnv, timeout: float) -> Store:
    if not env.agent_store or env.master_addr is None or env.master_port is None:
        raise ConfigError(
            "elastic training needs a store that outlives any worker: start the script "
            "with `potluck run --elastic --token SECRET ...`"
        )
    if env.etcd is not None:  # the store is in etcd: no agent hosts it, none moves it
        return RelayStore(EtcdStore(env.etcd, job_prefix(env.run_id),
                                    timedelta(seconds=timeout)), env.etcd)
    where = f"{env.master_addr}:{env.master_port}"
    # Across nodes the store may outlive its host: it moves to another node's agent.
    succession = Succession(env.run_id, where, env.store_node) if env.num_nodes > 1 else None
    try:
        store = RelayStore(TCPStore(env.master_addr, env.master_port, is_master=False,
                                    timeout=timedelta(seconds=timeout)),
                           where, succession=succession)
    except RuntimeError as exc:
        raise RendezvousError(
            f"cannot reach the job's store at {env.master_addr}:{env.master_port} ({exc}); "
            "is the launcher's agent on node 0 still running?"
        ) from exc
    if succession is not None:
        succession.use(store)
        succession.learn()
    return store


def _device(backend: str, env: WorkerEnv, wanted: str | None = None) -> torch.device:
    if wanted not in (None, "cpu", "cuda") or (backend == "nccl" and wanted == "cpu"):
        raise ConfigError(f"init(device={wanted!r}): pass 'cuda' (this worker's GPU), "
                          f"'cpu' (Gloo only), or leave it out (the {backend} default)")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise ConfigError("init(device='cuda'): this process sees no CUDA device; leave "
                          "device= out to train on the CPU")
    if backend != "nccl" and wanted != "cuda":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if backend != "nccl":  # Gloo with CUDA tensors: workers may share a GPU
        torch.cuda.set_device(env.local_rank % count)
        return torch.device("cuda", env.local_rank % count)
    if env.local_rank >= count:
        raise ConfigError(
            f"LOCAL_RANK={env.local_rank} but this host sees {count} CUDA device(s); "
            f"start at most {count} workers per node (--nproc-per-node {count})"
        )
    torch.cuda.set_device(env.local_rank)
    return torch.device("cuda", env.local_rank)
