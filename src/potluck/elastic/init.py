"""``potluck.elastic.init()``: an ``ElasticCohort`` from what ``potluck run`` tells a worker.

The launcher's agent hosts the store (so no worker's death takes it along) and hands
every worker the job's token. Every incarnation of a worker is a new member with a new
id (host, pid, random nonce): a restarted worker is admitted at a step boundary and
receives the live state from the cohort.
"""

from __future__ import annotations

import os
import secrets
import socket
from datetime import timedelta

from torch._C._distributed_c10d import TCPStore

from potluck.cohort.store import local_address
from potluck.elastic.cohort import ElasticCohort
from potluck.env import WorkerEnv, read_worker_env
from potluck.errors import ConfigError, RendezvousError
from potluck.rendezvous import RendezvousConfig


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
        join_timeout=join_timeout, prefix=f"potluck/{env.run_id}/rdzv",
    )
    worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    return ElasticCohort(store, worker_id, config, timeout=timeout, host=local_address(env),
                         prefix=f"potluck/{env.run_id}/elastic",
                         min_workers=env.min_workers,
                         min_workers_timeout=env.min_workers_timeout)
