"""``potluck.init()`` and ``Cohort``: this worker's membership in the job, right now.

``init`` reads the launcher's variables (``potluck.env``), picks the backend (NCCL on a
GPU, pinned to ``cuda:local_rank``; Gloo otherwise), reaches the job's store and builds
an explicit process-group object for generation 0. Nothing touches torch's global
default group, so a script may also call ``torch.distributed.init_process_group`` on its
own. Every collective the cohort runs is bounded by ``timeout`` and a failure becomes a
``PeerLostError`` naming the rank and generation.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any

import torch
from torch._C._distributed_c10d import Store

from potluck.cohort.groups import choose_backend, make_group, wait_collective
from potluck.cohort.store import connect_store, local_address
from potluck.collectives import retire_group
from potluck.env import WorkerEnv, read_worker_env
from potluck.errors import ConfigError, PeerLostError

log = logging.getLogger(__name__)


class Cohort:
    """The current generation's group of workers; use ``group`` with ``DataParallel``."""

    def __init__(
        self,
        env: WorkerEnv,
        backend: str,
        device: torch.device,
        store: Store,
        group: Any,
        timeout: float,
    ) -> None:
        self.env = env
        self.backend = backend
        self.device = device
        self.timeout = timeout
        self.generation = 0
        self._store: Store | None = store  # the next generation builds its group here
        self._group: Any = group
        self._lost: str | None = None  # why the group was retired, if it was

    # ------------------------------------------------------------------- who am I

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def local_world_size(self) -> int:
        return self.env.local_world_size

    @property
    def group(self) -> Any:
        """The backend object of this generation (``rank()``, ``size()``, collectives)."""
        if self._group is None:
            if self._lost is not None:
                raise ConfigError(
                    f"generation {self.generation}'s group was retired after a lost peer "
                    f"({self._lost}); it cannot be used again: stop, or recover into a "
                    "new generation with potluck.elastic"
                )
            raise ConfigError("this cohort is closed; call potluck.init() for a new one")
        return self._group

    # ---------------------------------------------------------------- collectives

    def wait(self, work: Any, what: str = "collective") -> Any:
        """Wait for a collective of ``group``; a failure raises ``PeerLostError``.

        The group is retired at once on a failure: it cannot be used again, and tearing
        it down now (not at interpreter exit) keeps the process from aborting later.
        """
        try:
            return wait_collective(work, rank=self.rank, generation=self.generation,
                                   what=what)
        except PeerLostError as exc:
            group, self._group, self._lost = self._group, None, exc.cause
            retire_group(group)
            raise

    def barrier(self) -> None:
        """Return once every rank got here; a lost peer raises ``PeerLostError``."""
        token = torch.zeros(1, device=self.device)
        self.wait(self.group.allreduce([token]), "barrier")

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` across ranks in place (bounded by the timeout) and return it."""
        self.wait(self.group.allreduce([tensor]), "all-reduce")
        return tensor

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Release the group and the store connection; safe to call twice."""
        group, self._group, self._store = self._group, None, None
        if group is not None and hasattr(group, "shutdown"):
            try:
                group.shutdown()
            except RuntimeError as exc:  # a peer already gone; nothing left to release
                log.debug("[rank %d] group shutdown: %s", self.rank, exc)

    def __enter__(self) -> Cohort:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Cohort(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r}, "
            f"device={self.device}, generation={self.generation})"
        )


def init(
    *,
    timeout: float = 60.0,
    backend: str | None = None,
    env: WorkerEnv | None = None,
) -> Cohort:
    """Join the job this process was started in (by ``potluck run``, torchrun or SLURM).

    ``timeout`` (seconds) bounds joining and every collective. Without launcher
    variables this is a single-process cohort (world size 1). ``env`` overrides what the
    environment says (tests, or a caller that knows better).
    """
    if not timeout > 0:
        raise ConfigError(f"timeout={timeout!r} must be a positive number of seconds, e.g. 60")
    env = read_worker_env() if env is None else env
    chosen = choose_backend(backend)
    device = _device(chosen, env)
    store = connect_store(env, timeout)
    host = local_address(env) if env.distributed else "127.0.0.1"
    group = make_group(chosen, store, env, 0, timeout, host)
    cohort = Cohort(env, chosen, device, store, group, timeout)
    log.info("[rank %d] joined: %r", env.rank, cohort)
    return cohort


def _device(backend: str, env: WorkerEnv) -> torch.device:
    if backend != "nccl":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if env.local_rank >= count:
        raise ConfigError(
            f"LOCAL_RANK={env.local_rank} but this host sees {count} CUDA device(s); "
            f"start at most {count} workers per node (--nproc-per-node {count})"
        )
    torch.cuda.set_device(env.local_rank)
    return torch.device("cuda", env.local_rank)
