"""What ``potluck run`` was asked to do, and the environment each worker gets from it.

Both are pure: ``LaunchConfig.validated`` checks the numbers, ``worker_environ`` builds
one worker's variables (torchrun's names and meanings, so a script written for torchrun
runs under potluck unchanged, and the reverse).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from potluck import env as names
from potluck.errors import ConfigError

DEFAULT_MULTI_NODE_PORT = 29500  # torchrun's default, for jobs that span nodes


@dataclass(frozen=True)
class LaunchConfig:
    """One node's share of a job: how many workers, where the store is, how to retry."""

    script: str
    script_args: tuple[str, ...] = ()
    module: bool = False
    nproc_per_node: int = 1
    nnodes: int = 1
    """The most nodes (``--nnodes MIN:MAX``'s MAX)."""
    min_nodes: int | None = None
    """Elastic: the nodes that found the cohort (MIN); more join later. None: ``nnodes``."""
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    """None: a free port on a single node, 29500 across nodes."""
    max_restarts: int = 0
    run_id: str = "potluck"
    grace_period: float = 5.0
    """Seconds between SIGTERM and SIGKILL when stopping workers."""
    join_timeout: float = 300.0
    """Seconds an agent waits for the store and for the other nodes' agents."""
    elastic: bool = False
    """A dead worker is restarted alone (a new member) while the others train on."""
    balance: bool = False
    """Workers' shares by measured speed (``potluck.prepare`` reads it)."""
    token: str | None = field(default=None, repr=False)
    """The job's shared secret, handed to the workers for admission (never printed)."""
    min_workers: int = 1
    """Elastic: below this many workers the cohort waits for joiners, then checkpoints."""
    min_workers_timeout: float = 60.0
    cohort_size: int | None = None
    """Elastic: the wanted size; more workers wait as spares."""
    swap_drag: float | None = None
    """Elastic: swap a member that drags the cohort this much for a spare (None: never)."""
    swap_window: int = 20
    log_dir: str | None = None
    """torchrun's ``--log-dir``: every worker's output is also written under it."""
    local_ranks_filter: tuple[int, ...] | None = None
    """torchrun's ``--local-ranks-filter``: only these local ranks' output is shown."""
    warm_spare: bool = True
    """Elastic with restarts: keep a worker process warm (torch imported) for the next one."""
    status_port: int | None = None
    """Node 0 serves the live status page on this port (0: a free one); None: no page."""
    status_host: str = "127.0.0.1"
    """The address the status page listens on (0.0.0.0: every interface)."""
    metrics_dir: str | None = None
    """Every worker writes its ``rank_step`` journal under it (``potluck plot``)."""
    etcd: str | None = None
    """``--rdzv-backend etcd``: the etcd endpoint (HOST:PORT) that holds the job's store,
    so no agent hosts one. None: node 0's agent hosts a ``TCPStore``."""

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def founders(self) -> int:
        """Workers that form generation 0 (the MIN nodes' workers)."""
        return self.nproc_per_node * (self.nnodes if self.min_nodes is None else self.min_nodes)

    def _check_population(self) -> None:
        """--cohort-size, --swap-drag, --swap-window: values and what they need."""
        if self.cohort_size is not None:
            if not self.elastic:
                raise ConfigError(
                    f"--cohort-size {self.cohort_size} only applies to --elastic runs "
                    "(spares wait to be admitted into a running cohort); add --elastic")
            if self.cohort_size < max(self.founders, self.min_workers):
                raise ConfigError(
                    f"--cohort-size {self.cohort_size} is below the {self.founders} workers "
                    f"that found the cohort or --min-workers {self.min_workers}: raise it, "
                    "or start fewer founding nodes (--nnodes MIN:MAX)")
        if self.swap_drag is None:
            return
        if self.cohort_size is None:
            raise ConfigError(
                f"--swap-drag {self.swap_drag:g} needs --cohort-size N: a swap takes a "
                "waiting spare, and only workers beyond the wanted size wait as spares")
        if not 0 < self.swap_drag < 1:
            raise ConfigError(
                f"--swap-drag {self.swap_drag:g} must be a fraction between 0 and 1 (0.3: "
                "swap a member whose absence would make the cohort 30% faster or more)")
        if self.swap_window < 4:
            raise ConfigError(
                f"--swap-window {self.swap_window} must be at least 4 steps (the cohort "
                "checks every quarter window, and a swap weighs several checks)")

    def validated(self) -> LaunchConfig:
        """Self, after checking every field; raises ``ConfigError`` naming the bad one."""
        _at_least("--nproc-per-node", self.nproc_per_node, 1)
        _at_least("--nnodes", self.nnodes, 1)
        _at_least("--node-rank", self.node_rank, 0)
        _at_least("--max-restarts", self.max_restarts, 0)
        if self.node_rank >= self.nnodes:
            raise ConfigError(
                f"--node-rank {self.node_rank} with --nnodes {self.nnodes}: node ranks count "
                f"from 0, so use 0..{self.nnodes - 1}"
            )
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise ConfigError(f"--master-port {self.master_port} is not a TCP port; use 1..65535")
        if self.grace_period < 0 or self.join_timeout <= 0:
            raise ConfigError(
                f"grace period {self.grace_period} s and join timeout {self.join_timeout} s "
                "must be positive"
            )
        self._validate_elastic()
        bad = [r for r in self.local_ranks_filter or () if not 0 <= r < self.nproc_per_node]
        if bad:
            raise ConfigError(
                f"--local-ranks-filter names local rank(s) {bad}, but this node runs "
                f"{self.nproc_per_node} worker(s): use 0..{self.nproc_per_node - 1}, e.g. "
                "--local-ranks-filter 0"
            )
        if self.status_port is not None and not 0 <= self.status_port < 65536:
            raise ConfigError(f"--status-port {self.status_port} is not a TCP port; use "
                              "1..65535, or 0 for a free one")
        if not self.script:
            raise ConfigError("no script to run: potluck run [options] script.py [args...]")
        self._validate_etcd()
        return self

    def _validate_etcd(self) -> None:
        if self.etcd is not None and not self.elastic:
            raise ConfigError(
                "--rdzv-backend etcd keeps an elastic job's membership in etcd: add "
                "--elastic (a script on potluck.prepare or potluck.init()), or drop "
                "--rdzv-backend etcd for a fixed job")
        if self.etcd is not None and self.status_port is not None:
            raise ConfigError(
                f"--status-port {self.status_port} with --rdzv-backend etcd: the status "
                "page reads node 0's own store, which an etcd job does not have; drop "
                "--status-port (or --rdzv-backend etcd)")

    def _validate_elastic(self) -> None:
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nnodes:
            raise ConfigError(
                f"--nnodes {self.min_nodes}:{self.nnodes}: MIN must be between 1 and MAX, "
                "e.g. 1:4"
            )
        if self.min_nodes not in (None, self.nnodes) and not self.elastic:
            raise ConfigError(
                f"--nnodes {self.min_nodes}:{self.nnodes} lets nodes join a running job, "
                "which needs --elastic (and a script using potluck.prepare or "
                f"potluck.init()); or give a fixed count, e.g. --nnodes {self.nnodes}"
            )
        _at_least("--min-workers", self.min_workers, 1)
        if self.min_workers > 1 and not self.elastic:
            raise ConfigError(
                f"--min-workers {self.min_workers} only applies to --elastic runs (a fixed "
                "job stops at the first lost worker); add --elastic or drop it"
            )
        if self.min_workers > self.world_size:
            raise ConfigError(
                f"--min-workers {self.min_workers} is more than the job can ever have "
                f"({self.nnodes} node(s) x {self.nproc_per_node} = {self.world_size}); "
                "lower it or raise --nnodes / --nproc-per-node"
            )
        self._check_population()
        if not self.min_workers_timeout > 0:
            raise ConfigError(
                f"--min-workers-timeout {self.min_workers_timeout} must be a positive "
                "number of seconds, e.g. 60"
            )

    def port_to_host(self) -> int:
        """The port node 0 binds the store to (0 lets the OS pick one on a single node)."""
        if self.master_port is not None:
            return self.master_port
        return 0 if self.nnodes == 1 else DEFAULT_MULTI_NODE_PORT


@dataclass(frozen=True)
class Layout:
    """Where this node's workers sit in the job: the rank of its local rank 0, and the
    job's world size. Nodes may run different ``--nproc-per-node``: the agents exchange
    their counts before the workers start (``static_layout``)."""

    rank_offset: int
    world_size: int

    @staticmethod
    def assumed(config: LaunchConfig) -> Layout:
        """Every node as this one (a single node; or before the nodes have met)."""
        return Layout(config.node_rank * config.nproc_per_node, config.world_size)


def static_layout(nprocs: list[int], node_rank: int) -> Layout:
    """Node ``node_rank``'s layout when node r runs ``nprocs[r]`` workers: ranks are
    handed out node by node, in node rank order."""
    return Layout(sum(nprocs[:node_rank]), sum(nprocs))


def _at_least(flag: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ConfigError(f"{flag} {value} must be at least {minimum}")


def worker_environ(
    config: LaunchConfig,
    *,
    local_rank: int,
    master_port: int,
    restart_count: int,
    master_addr: str | None = None,
    store_node: int = 0,
    base: Mapping[str, str],
    error_file: str,
    agent_pid: int,
    finished_file: str | None = None,
    layout: Layout | None = None,
) -> dict[str, str]:
    """The complete environment of one worker: ``base`` plus the launcher's variables.
    ``master_addr``: where the job's store is, if it moved from ``--master-addr``, and
    ``store_node`` the node whose agent hosts it."""
    layout = layout or Layout.assumed(config)
    rank = layout.rank_offset + local_rank
    env = dict(base)
    env.update({
        names.RANK: str(rank),
        names.LOCAL_RANK: str(local_rank),
        names.WORLD_SIZE: str(layout.world_size),
        names.LOCAL_WORLD_SIZE: str(config.nproc_per_node),
        names.GROUP_RANK: str(config.node_rank),
        names.GROUP_WORLD_SIZE: str(config.nnodes),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": str(layout.world_size),
        names.MASTER_ADDR: master_addr or config.master_addr,
        names.STORE_NODE: str(store_node),
        names.MASTER_PORT: str(master_port),
        names.RESTART_COUNT: str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(config.max_restarts),
        names.RUN_ID: config.run_id,
        names.AGENT_STORE: "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        names.ERROR_FILE: error_file,
        names.AGENT_PID: str(agent_pid),
    })
    if finished_file is not None:
        env[names.FINISHED_FILE] = finished_file
    if config.token:
        env[names.TOKEN] = config.token
    if config.balance:
        env[names.BALANCE] = "1"
    if config.status_port is not None:
        env[names.STATUS] = "1"
    if config.metrics_dir is not None:
        env[names.METRICS_DIR] = config.metrics_dir
    if config.etcd is not None:
        env[names.ETCD] = config.etcd
    if config.cohort_size is not None:
        env[names.COHORT_SIZE] = str(config.cohort_size)
    if config.swap_drag is not None:
        env[names.SWAP_DRAG] = f"{config.swap_drag:g}"
        env[names.SWAP_WINDOW] = str(config.swap_window)
    if config.elastic:
        env[names.ELASTIC] = "1"
        env[names.FOUNDERS] = str(config.founders)
        env[names.MIN_WORKERS] = str(config.min_workers)
        env[names.MIN_WORKERS_TIMEOUT] = f"{config.min_workers_timeout:g}"
    # Several workers share the cores: one thread each unless the user chose (as torchrun).
    if config.nproc_per_node > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    # Lines reach the launcher as they are printed, not when a buffer fills.
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
