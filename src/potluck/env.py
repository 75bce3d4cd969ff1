"""Where am I: the one place that reads environment variables.

``read_worker_env`` turns the variables that ``potluck run``, ``torchrun`` or SLURM set
into a frozen ``WorkerEnv``. No variables at all means a single process (world size 1).
Every function takes the mapping to read (default ``os.environ``), so the parsing is
tested without touching the real environment. Nothing here writes ``os.environ``.

Precedence: torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, ...) win over
SLURM's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, ...), which are used only where the
torchrun-style one is unset.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from potluck.errors import ConfigError

# Variables a launcher sets on its workers (torchrun's names, so scripts run under both).
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
RUN_ID = "TORCHELASTIC_RUN_ID"
# "True" when the launcher's agent hosts the TCPStore (torch reads the same variable).
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
# potluck's own: where the worker bootstrap writes an uncaught exception, and the agent.
ERROR_FILE = "POTLUCK_ERROR_FILE"
FINISHED_FILE = "POTLUCK_FINISHED_FILE"  # written once the user's script ran to its end
TOKEN = "POTLUCK_TOKEN"  # the job's shared secret for admission (elastic runs)
STORE_NODE = "POTLUCK_STORE_NODE"  # which node's agent hosts the store (it may have moved)
AGENT_PID = "POTLUCK_AGENT_PID"
# `potluck run --rdzv-backend etcd`: the etcd client endpoint (HOST:PORT) holding the store.
ETCD = "POTLUCK_ETCD"
# Elastic runs: how many workers found the cohort (the others join later), and below
# how many it stops training to wait for joiners (then checkpoints and exits).
ELASTIC = "POTLUCK_ELASTIC"  # "1" under `potluck run --elastic`
BALANCE = "POTLUCK_BALANCE"  # "1" under `potluck run --balance`: prepare() balances shares
STATUS = "POTLUCK_STATUS"  # "1" under `potluck run --status-port`: workers publish their steps
METRICS_DIR = "POTLUCK_METRICS_DIR"  # `potluck run --metrics-dir`: rank_step journals go here
FOUNDERS = "POTLUCK_FOUNDERS"
MIN_WORKERS = "POTLUCK_MIN_WORKERS"
MIN_WORKERS_TIMEOUT = "POTLUCK_MIN_WORKERS_TIMEOUT"
# The cohort's wanted size (more workers wait as spares) and the swap of a member that
# drags it down for a spare: `potluck run --cohort-size N --swap-drag F --swap-window S`.
COHORT_SIZE = "POTLUCK_COHORT_SIZE"
SWAP_DRAG = "POTLUCK_SWAP_DRAG"
SWAP_WINDOW = "POTLUCK_SWAP_WINDOW"
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
# A warm spare's pipe: the agent writes the environment of the worker it replaces there.
STANDBY_FD = "POTLUCK_STANDBY_FD"
# The spare template's socket to its agent (``launch.template``).
TEMPLATE_FD = "POTLUCK_TEMPLATE_FD"


@dataclass(frozen=True)
class WorkerEnv:
    """This process's place in the job, as its launcher described it."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    restart_count: int = 0
    run_id: str = "none"
    agent_store: bool = False
    """True when a launcher's agent hosts the TCPStore; else rank 0 hosts it."""
    store_node: int = 0
    """The node whose agent hosts the store at ``master_addr`` (not 0 once it moved)."""
    gloo_ifname: str | None = None
    source: str = "none"
    """Who described the job: "torchrun" (potluck run or torchrun), "slurm" or "none"."""
    token: str | None = field(default=None, repr=False)
    """The shared secret that admits a worker to an elastic cohort (never printed)."""
    founders: int | None = None
    """Elastic: generation 0 forms with this many workers (None: ``world_size``)."""
    min_workers: int = 1
    min_workers_timeout: float = 60.0
    cohort_size: int | None = None
    """Elastic: the wanted size; joiners beyond it wait as spares (None: no cap)."""
    swap_drag: float | None = None
    """Swap a member that drags the cohort below this fraction of its prediction."""
    swap_window: int = 20
    """The steps over which the drag must hold before a swap."""
    elastic: bool = False
    """Started by ``potluck run --elastic``: ``potluck.init()`` joins an elastic cohort."""
    balance: bool = False
    """Started by ``potluck run --balance``: ``potluck.prepare`` sets shares by speed."""
    status: bool = False
    """Publish each step's figures on the store for the launcher's status page."""
    metrics_dir: str | None = None
    """Where each worker writes its ``rank_step`` journal (``ranks/rank-<pid>.jsonl``)."""
    etcd: str | None = None
    """The etcd endpoint (HOST:PORT) that holds the job's store; None: a ``TCPStore``."""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


CPP_LOG_LEVEL = "TORCH_CPP_LOG_LEVEL"  # read once, when torch's C++ library loads
_QUIETED: list[bool] = []  # quiet_cpp_warnings() set it (the user had not)


def quiet_cpp_warnings() -> None:
    """This process's C++ warnings off, unless the user set ``TORCH_CPP_LOG_LEVEL``:
    ``potluck run``'s agent, before it imports torch, so its store client's broken
    connections are not C++ stack traces (the agent says what happened in words). Its
    workers get the user's setting (``environ_copy``)."""
    if CPP_LOG_LEVEL not in os.environ:
        os.environ[CPP_LOG_LEVEL] = "ERROR"
        _QUIETED.append(True)


def environ_copy(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of the environment, the base a launcher extends for its children (without
    what ``quiet_cpp_warnings`` set for the launcher alone)."""
    copied = dict(os.environ if environ is None else environ)
    if _QUIETED and environ is None:
        copied.pop(CPP_LOG_LEVEL, None)
    return copied


def error_file(environ: Mapping[str, str] | None = None) -> str | None:
    """Where this worker should write the traceback of an uncaught exception, if anywhere."""
    value = (os.environ if environ is None else environ).get(ERROR_FILE, "")
    return value or None


def finished_file(environ: Mapping[str, str] | None = None) -> str | None:
    """Where this worker records that its script ran to its end, if anywhere."""
    value = (os.environ if environ is None else environ).get(FINISHED_FILE, "")
    return value or None


def agent_pid(environ: Mapping[str, str] | None = None) -> int | None:
    """The pid of the launcher agent that started this worker, if one did."""
    env = os.environ if environ is None else environ
    return _int(env, AGENT_PID, None, minimum=1)


def standby_fd(environ: Mapping[str, str] | None = None) -> int | None:
    """The pipe a warm spare waits on for its worker's environment; None: not a spare."""
    env = os.environ if environ is None else environ
    return _int(env, STANDBY_FD, None, minimum=0)


def template_fd(environ: Mapping[str, str] | None = None) -> int | None:
    """The spare template's socket to its agent; None: not the template."""
    env = os.environ if environ is None else environ
    return _int(env, TEMPLATE_FD, None, minimum=0)


def launched_world_size(environ: Mapping[str, str] | None = None) -> int:
    """``WORLD_SIZE`` as ``potluck run`` or ``torchrun`` set it (1 when unset). SLURM's task
    count is left out: a batch script runs one process in an allocation of many tasks."""
    env = os.environ if environ is None else environ
    return _int(env, WORLD_SIZE, 1, minimum=1) or 1


def read_worker_env(environ: Mapping[str, str] | None = None) -> WorkerEnv:
    """Parse the launcher's variables; raise ``ConfigError`` naming any bad one."""
    env = os.environ if environ is None else environ
    slurm = "SLURM_PROCID" in env and RANK not in env
    rank = _first_int(env, (RANK, "SLURM_PROCID"), 0, minimum=0)
    world_size = _first_int(env, (WORLD_SIZE, "SLURM_NTASKS"), 1, minimum=1)
    local_rank = _first_int(env, (LOCAL_RANK, "SLURM_LOCALID"), 0, minimum=0)
    node_rank = _first_int(env, (GROUP_RANK, "SLURM_NODEID"), 0, minimum=0)
    num_nodes = _first_int(env, (GROUP_WORLD_SIZE, "SLURM_NNODES"), 1, minimum=1)
    local_world_size = _local_world_size(env, max(1, world_size // num_nodes))
    _check_less(RANK, rank, WORLD_SIZE, world_size)
    _check_less(LOCAL_RANK, local_rank, LOCAL_WORLD_SIZE, local_world_size)
    master_addr = env.get(MASTER_ADDR) or None
    if master_addr is None and "SLURM_NODELIST" in env:
        master_addr = first_host(env["SLURM_NODELIST"])
    master_port = _int(env, MASTER_PORT, None, minimum=1)
    if master_port is not None and master_port > 65535:
        raise ConfigError(f"{MASTER_PORT}={master_port} is not a TCP port; use 1..65535")
    if world_size > 1 and master_addr is None:
        raise ConfigError(
            f"{WORLD_SIZE}={world_size} but {MASTER_ADDR} is not set: the workers cannot "
            "find each other; start the script with `potluck run` or `torchrun`, or set "
            f"{MASTER_ADDR} and {MASTER_PORT} to the address and port of rank 0's host"
        )
    if world_size > 1 and master_port is None:
        master_port = 29500  # torch's default, as torchrun and SLURM users expect
    return WorkerEnv(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=master_port,
        restart_count=_int(env, RESTART_COUNT, 0, minimum=0) or 0,
        run_id=env.get(RUN_ID) or env.get("SLURM_JOB_ID") or "none",
        agent_store=env.get(AGENT_STORE, "").lower() in ("1", "true"),
        store_node=_int(env, STORE_NODE, 0, minimum=0) or 0,
        gloo_ifname=env.get(GLOO_SOCKET_IFNAME) or None,
        source="slurm" if slurm else ("torchrun" if RANK in env else "none"),
        token=env.get(TOKEN) or None,
        founders=_int(env, FOUNDERS, None, minimum=1),
        min_workers=_int(env, MIN_WORKERS, 1, minimum=1) or 1,
        min_workers_timeout=_seconds(env, MIN_WORKERS_TIMEOUT, 60.0),
        cohort_size=_int(env, COHORT_SIZE, None, minimum=1),
        swap_drag=_fraction(env, SWAP_DRAG),
        swap_window=_int(env, SWAP_WINDOW, 20, minimum=4) or 20,
        elastic=env.get(ELASTIC, "") == "1",
        balance=env.get(BALANCE, "") == "1",
        status=env.get(STATUS, "") == "1",
        metrics_dir=env.get(METRICS_DIR) or None,
        etcd=env.get(ETCD) or None,
    )


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``"gpu[03-05,07],cpu1"`` gives ``"gpu03"``."""
    match = re.match(r"\s*([^,\[\s]+)(?:\[([^\]]*)\])?", nodelist)
    if match is None or not match.group(1):
        raise ConfigError(
            f"SLURM_NODELIST={nodelist!r} names no host; set MASTER_ADDR to rank 0's host"
        )
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0].strip()
    return prefix + first


def _local_world_size(env: Mapping[str, str], per_node: int) -> int:
    if LOCAL_WORLD_SIZE in env:
        return _first_int(env, (LOCAL_WORLD_SIZE,), 1, minimum=1)
    tasks = env.get("SLURM_TASKS_PER_NODE")  # e.g. "4(x2)" or "2,1"
    if tasks:
        match = re.match(r"\s*(\d+)", tasks)
        if match:
            return max(1, int(match.group(1)))
    return per_node


def _first_int(
    env: Mapping[str, str], names: tuple[str, ...], default: int, *, minimum: int
) -> int:
    for name in names:
        value = _int(env, name, None, minimum=minimum)
        if value is not None:
            return value
    return default


def _int(env: Mapping[str, str], name: str, default: int | None, *, minimum: int) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(
            f"{name}={raw!r} is not an integer; launchers set it to a number, so unset it "
            "or fix the script that sets it"
        ) from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}; fix or unset it")
    return value


def _fraction(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise ConfigError(f"{name}={raw!r} must be a fraction between 0 and 1, e.g. 0.3")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{name}={raw!r} must be a positive number of seconds, e.g. 60")
    return value


def _check_less(name: str, value: int, limit_name: str, limit: int) -> None:
    if value >= limit:
        raise ConfigError(
            f"{name}={value} but {limit_name}={limit}: ranks count from 0, so {name} must be "
            f"below {limit_name}; the launcher's variables disagree, start the job again "
            "with `potluck run` or fix the exported values"
        )
