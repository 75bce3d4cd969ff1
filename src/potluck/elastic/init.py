"""``potluck.elastic.init()``: an ``ElasticCohort`` from what ``potluck run`` tells a worker.

The launcher's agent hosts the store (so no worker's death takes it along) and hands
every worker the job's token. Every incarnation of a worker is a new member with a new
id (host, pid, random nonce): a restarted worker is admitted at a step boundary and
receives the live state from the cohort. The agent sees a worker die at once and says
so in the store (``mark_exited``), so the survivors need not wait for its heartbeat.
"""

from __future__ import annotations

import os
import secrets
import socket
from datetime import timedelta

from torch._C._distributed_c10d import Store, TCPStore

from potluck.cohort.store import local_address
from potluck.elastic.cohort import ElasticCohort
from potluck.elastic.minimum import MinimumSize
from potluck.env import WorkerEnv, read_worker_env
from potluck.errors import ConfigError, RendezvousError
from potluck.rendezvous import RendezvousConfig, keys


def init(*, timeout: float = 60.0, heartbeat_interval: float = 0.5,
         heartbeat_timeout: float = 3.0, settle_timeout: float = 30.0,
         join_timeout: float = 300.0, env: WorkerEnv | None = None) -> ElasticCohort:
    """Join (or found) the job's elastic cohort; ``timeout`` bounds every collective."""
    env = env or read_worker_env()
    if not env.agent_store or env.master_addr is None or env.master_port is None:
        raise ConfigError(
            "elastic training needs a store that outlives any worker: start the script "
            "with `potluck run --elastic --token SECRET ...`"
        )
    if not env.token:
        raise ConfigError(
            "elastic training needs the job's shared secret: pass --token SECRET to "
            "`potluck run` (every worker must hold it to be admitted)"
        )
    try:
        store = TCPStore(env.master_addr, env.master_port, is_master=False,
                         timeout=timedelta(seconds=timeout))
    except RuntimeError as exc:
        raise RendezvousError(
            f"cannot reach the job's store at {env.master_addr}:{env.master_port} ({exc}); "
            "is the launcher's agent on node 0 still running?"
        ) from exc
    config = RendezvousConfig(
        token=env.token, expected=env.founders or env.world_size,
        heartbeat_interval=heartbeat_interval, heartbeat_timeout=heartbeat_timeout,
        settle_timeout=settle_timeout,
        join_timeout=join_timeout, prefix=_rendezvous_prefix(env.run_id),
    )
    worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    # The agent that started this process reports its death under this key (mark_exited).
    store.set(process_key(env.run_id, os.getpid()), worker_id)
    return ElasticCohort(store, worker_id, config, timeout=timeout, host=local_address(env),
                         prefix=f"potluck/{env.run_id}/elastic",
                         minimum=MinimumSize(env.min_workers, env.min_workers_timeout))


def mark_exited(store: Store, run_id: str, pid: int) -> None:
    """The agent saw worker process ``pid`` die: count it out of the cohort now.

    Its member id gets a leave key, so the survivors' next generation forms without
    waiting for its heartbeat to go stale. A process that never joined is ignored.
    """
    key = process_key(run_id, pid)
    if store.check([key]):
        worker_id = store.get(key).decode()
        store.set(f"{_rendezvous_prefix(run_id)}/{keys.leave(worker_id)}", "exited")


def _rendezvous_prefix(run_id: str) -> str:
    return f"potluck/{run_id}/rdzv"


def process_key(run_id: str, pid: int) -> str:
    """Where ``init()`` writes the member id of worker process ``pid`` on this host."""
    return f"potluck/{run_id}/process/{socket.gethostname()}/{pid}"
