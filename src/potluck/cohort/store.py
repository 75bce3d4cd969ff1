"""Reaching the job's ``TCPStore``: as a client, or as its host when nobody else is.

Who hosts the store: the launcher's agent when one says so
(``TORCHELASTIC_USE_AGENT_STORE=True``, set by ``potluck run`` and by ``torchrun``), so a
worker's death never takes the rendezvous with it. Without such an agent (variables set
by hand, SLURM ``srun``), rank 0 hosts it inside its own process and every other rank
connects as a client.
"""

from __future__ import annotations

import socket
from datetime import timedelta

from torch._C._distributed_c10d import HashStore, Store, TCPStore

from potluck.env import WorkerEnv
from potluck.errors import ConfigError, RendezvousError
from potluck.relay import RelayStore


def connect_store(env: WorkerEnv, timeout: float) -> Store:
    """The job's store for ``env``; a single process gets an in-memory store."""
    if not env.distributed:
        return HashStore()
    host, port = _address(env)
    hosting = not env.agent_store and env.rank == 0
    try:
        return RelayStore(TCPStore(
            host, port, env.world_size if hosting else None, hosting,
            timedelta(seconds=timeout), wait_for_workers=False,
        ), f"{host}:{port}")
    except (RuntimeError, OSError) as exc:
        if hosting:
            raise ConfigError(
                f"rank 0 could not host the store on port {port}: {exc}; the port is "
                "probably in use: pick a free MASTER_PORT, or start the job with "
                "`potluck run`, which hosts the store for you"
            ) from exc
        raise RendezvousError(
            f"rank {env.rank} could not reach the store at {host}:{port} within "
            f"{timeout:g} s ({exc}); check that MASTER_ADDR/MASTER_PORT name the first "
            "node, that its launcher is running, and that no firewall blocks the port"
        ) from exc


def local_address(env: WorkerEnv) -> str:
    """This host's address on the route to the master (what peers can dial)."""
    host, port = _address(env)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))  # UDP: picks a route, sends nothing
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()


def _address(env: WorkerEnv) -> tuple[str, int]:
    if env.master_addr is None or env.master_port is None:
        raise ConfigError(
            f"world size {env.world_size} needs MASTER_ADDR and MASTER_PORT; start the "
            "script with `potluck run` or `torchrun`"
        )
    return env.master_addr, env.master_port
