"""What the job's scheduler says about this node: defaults for ``potluck run``'s flags.

Started by SLURM's ``srun``, in a Kubernetes pod (a Kubeflow PyTorchJob or TrainJob, or
an Indexed Job) or by SkyPilot, ``potluck run`` finds the node count, this node's rank
and node 0's address in the variables the scheduler sets. One reader per scheduler
turns its variables into ``Hint``s; ``resolve`` picks each flag's value: the flag when
given, else the first reader in ``READERS`` that has one, else the built-in default.

Everything here is pure: it reads the mapping it is handed (the CLI passes
``os.environ``) and returns notes for the CLI to print. It imports no torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from potluck.env import first_host
from potluck.errors import ConfigError

Value = str | int
"""A flag's value: ``--nproc-per-node``, ``--nnodes``, ``--master-addr`` and ``--run-id``
as text (``auto``, ``1:4``), ``--node-rank`` and ``--master-port`` as numbers."""

FLAGS = {
    "nproc_per_node": "--nproc-per-node",
    "nnodes": "--nnodes",
    "node_rank": "--node-rank",
    "master_addr": "--master-addr",
    "master_port": "--master-port",
    "run_id": "--run-id",
}
DEFAULTS: dict[str, Value | None] = {
    "nproc_per_node": "1", "nnodes": "1", "node_rank": 0,
    "master_addr": None, "master_port": None, "run_id": "potluck",
}


@dataclass(frozen=True)
class Hint:
    """One flag's value as one scheduler variable gives it."""

    flag: str
    """A key of ``FLAGS``."""
    value: Value
    variable: str
    """The variable and its text, e.g. ``SLURM_NNODES=2``."""
    scheduler: str


@dataclass(frozen=True)
class Reading:
    """What one scheduler's variables say: values for flags, and notes for the user."""

    hints: tuple[Hint, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Resolved:
    """Every flag's value, where it came from, and what to tell the user once."""

    values: Mapping[str, Value | None]
    origins: Mapping[str, str] = field(default_factory=dict)
    """For each flag: "flag", "default", or the variable that gave it."""
    notes: tuple[str, ...] = ()


Env = Mapping[str, str]


def torchrun_env(env: Env) -> Reading:
    """torchrun reads ``PET_<FLAG>`` as a flag's default; Kubeflow's operators set them."""
    name = "torchrun PET_* variables"
    hints = [
        _text(env, "PET_NPROC_PER_NODE", "nproc_per_node", name, r"\d+|auto|gpu|cpu",
              "a count, or auto, gpu, cpu"),
        _text(env, "PET_NNODES", "nnodes", name, r"\d+(:\d+)?", "a count N or MIN:MAX"),
        _number(env, "PET_NODE_RANK", "node_rank", name, minimum=0),
        _text(env, "PET_MASTER_ADDR", "master_addr", name, r"\S+", "a hostname or IP"),
        _port(env, "PET_MASTER_PORT", name),
    ]
    return Reading(_present(hints))


def slurm(env: Env) -> Reading:
    """``srun`` with one task per node; outside a step only the job id is used."""
    name = "SLURM"
    if not env.get("SLURM_JOB_ID", "").strip():
        return Reading()
    hints = [_text(env, "SLURM_JOB_ID", "run_id", name, r"\S+", "the job's id")]
    nodes_var = _first_set(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES")
    nodes = _number(env, nodes_var, "nnodes", name, minimum=1)
    if _first_set(env, "SLURM_STEP_ID", "SLURM_STEPID") is None:  # a batch script itself
        if nodes is not None and int(nodes.value) > 1:
            return Reading(_present(hints), (
                f"{nodes.variable} but potluck run is not under srun, so it runs on this "
                "node only; to use every node: srun --ntasks-per-node=1 potluck run ...",))
        return Reading(_present(hints))
    tasks_var = _first_set(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    tasks = _whole(env, tasks_var, name, minimum=1,
                   fix="or start one task per node: srun --ntasks-per-node=1")
    if tasks is not None and nodes is not None and tasks != nodes.value:
        raise ConfigError(
            f"srun started {tasks} task(s) on {nodes.value} node(s) ({tasks_var}={tasks}, "
            f"{nodes.variable}): potluck run is one task per node and starts that node's "
            "workers itself; use srun --ntasks-per-node=1 potluck run --nproc-per-node N "
            "..., or srun -n N python script.py without potluck run")
    rank = _number(env, "SLURM_NODEID", "node_rank", name, minimum=0)
    _check_rank(rank, nodes)
    hints += [_as_text(nodes), rank, _slurm_host(env, name)]
    return Reading(_present(hints))


def skypilot(env: Env) -> Reading:
    """``SKYPILOT_NODE_IPS`` holds one IP a line; the first is the head node (node 0)."""
    name = "SkyPilot"
    ips_text = env.get("SKYPILOT_NODE_IPS", "")
    ips = [line.strip() for line in ips_text.splitlines() if line.strip()]
    nodes = _as_text(_number(env, "SKYPILOT_NUM_NODES", "nnodes", name, minimum=1))
    if ips and nodes is not None and str(len(ips)) != nodes.value:
        raise ConfigError(
            f"SKYPILOT_NODE_IPS lists {len(ips)} address(es) but {nodes.variable}: SkyPilot "
            "sets one IP a line for each node; unset or fix the one exported by hand, or "
            "pass --nnodes and --master-addr")
    if ips and nodes is None:
        nodes = Hint("nnodes", str(len(ips)), f"{len(ips)} lines of SKYPILOT_NODE_IPS", name)
    head = None
    if ips:
        head = Hint("master_addr", ips[0], "first line of SKYPILOT_NODE_IPS", name)
    gpus = _number(env, "SKYPILOT_NUM_GPUS_PER_NODE", "nproc_per_node", name, minimum=0)
    if gpus is not None and gpus.value == 0:  # a CPU cluster: --nproc-per-node's default
        gpus = None
    rank = _number(env, "SKYPILOT_NODE_RANK", "node_rank", name, minimum=0)
    _check_rank(rank, nodes)
    run_id = _text(env, "SKYPILOT_TASK_ID", "run_id", name, r"\S+", "the task's id")
    return Reading(_present([_as_text(gpus), nodes, rank, head, run_id]))


def pytorchjob(env: Env) -> Reading:
    """A Kubeflow PyTorchJob sets torch's ``MASTER_ADDR``/``MASTER_PORT`` and counts
    nodes in ``WORLD_SIZE`` and ``RANK``. Read only in a Kubernetes pod (which always
    has ``KUBERNETES_SERVICE_HOST``). Under a launcher's worker (``LOCAL_RANK`` or
    ``GROUP_RANK`` set) these count processes instead, so they are left alone then."""
    name = "PyTorchJob/torch"
    if any(key in env for key in ("LOCAL_RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID")):
        return Reading()
    if "KUBERNETES_SERVICE_HOST" not in env:  # (a stale export in a shell is no job)
        return Reading()
    nodes = _number(env, "WORLD_SIZE", "nnodes", name, minimum=1)
    rank = _number(env, "RANK", "node_rank", name, minimum=0)
    _check_rank(rank, nodes)
    addr = _text(env, "MASTER_ADDR", "master_addr", name, r"\S+", "a hostname or IP")
    return Reading(_present([_as_text(nodes), rank, addr, _port(env, "MASTER_PORT", name)]))


def indexed_job(env: Env) -> Reading:
    """A Kubernetes Indexed Job gives each pod ``JOB_COMPLETION_INDEX``: its node rank."""
    name = "Kubernetes Indexed Job"
    return Reading(_present([_number(env, "JOB_COMPLETION_INDEX", "node_rank", name,
                                     minimum=0)]))


Reader = Callable[[Env], Reading]
READERS: tuple[Reader, ...] = (torchrun_env, slurm, skypilot, pytorchjob, indexed_job)
"""Earlier readers win where two give a flag different values (the note says which)."""


def resolve(given: Mapping[str, Value | None], env: Env,
            readers: tuple[Reader, ...] = READERS) -> Resolved:
    """Each flag's value: ``given`` (None: not given), else a scheduler's, else default."""
    readings = [read(env) for read in readers]
    hints = [hint for reading in readings for hint in reading.hints]
    notes = [note for reading in readings for note in reading.notes]
    values: dict[str, Value | None] = {}
    origins: dict[str, str] = {}
    for flag in FLAGS:
        offered = [hint for hint in hints if hint.flag == flag]
        if given.get(flag) is not None:
            values[flag], origins[flag] = given[flag], "flag"
        elif offered:
            values[flag], origins[flag] = offered[0].value, offered[0].variable
        else:
            values[flag], origins[flag] = DEFAULTS[flag], "default"
        others = [f"{h.variable} ({h.scheduler})" for h in offered if h.value != values[flag]]
        if others:
            used = "the flag" if origins[flag] == "flag" else origins[flag]
            notes.append(f"{FLAGS[flag]} {values[flag]} from {used} is used; "
                         f"{' and '.join(others)} said otherwise")
    _check_resolved_rank(values, origins)
    return Resolved(values, origins, tuple(notes))


def summary(resolved: Resolved) -> str | None:
    """One line naming the flags a scheduler gave, or None when none did."""
    taken = [f"{FLAGS[flag]} {resolved.values[flag]} ({origin})"
             for flag, origin in resolved.origins.items() if origin not in ("flag", "default")]
    return "from the scheduler: " + ", ".join(taken) if taken else None


def _check_resolved_rank(values: Mapping[str, Value | None], origins: Mapping[str, str]
                         ) -> None:
    nnodes, rank = str(values["nnodes"]), values["node_rank"]
    if origins["nnodes"] == origins["node_rank"] == "flag" or not isinstance(rank, int):
        return  # LaunchConfig.validated names the two flags itself
    most = nnodes.rpartition(":")[2]
    if most.isdigit() and rank >= int(most):
        raise ConfigError(
            f"node rank {rank} (from {_origin('node_rank', origins)}) is not below the node "
            f"count {nnodes} (from {_origin('nnodes', origins)}): node ranks count from 0; "
            "pass --nnodes with the job's node count (a Kubernetes Job's completions, say)")


def _origin(flag: str, origins: Mapping[str, str]) -> str:
    """Where a flag's value came from, as a message says it."""
    origin = origins[flag]
    return {"flag": FLAGS[flag], "default": f"{FLAGS[flag]}'s default"}.get(origin, origin)


def _check_rank(rank: Hint | None, nodes: Hint | None) -> None:
    if rank is not None and nodes is not None and int(rank.value) >= int(nodes.value):
        raise ConfigError(
            f"{rank.variable} but {nodes.variable}: node ranks count from 0, so the rank "
            f"must be below the node count; {rank.scheduler}'s variables disagree, unset "
            "the one exported by hand or pass --nnodes and --node-rank")


def _slurm_host(env: Env, scheduler: str) -> Hint | None:
    variable = _first_set(env, "SLURM_STEP_NODELIST", "SLURM_NODELIST")
    if variable is None:
        return None
    nodelist = env[variable]
    try:
        host = first_host(nodelist)
    except ConfigError:
        raise ConfigError(
            f"{variable}={nodelist!r} names no host: SLURM sets a node list such as "
            "gpu[01-04]; pass --master-addr with node 0's hostname") from None
    return Hint("master_addr", host, f"first host of {variable}={nodelist}", scheduler)


def _first_set(env: Env, *names: str) -> str | None:
    return next((name for name in names if env.get(name, "").strip()), None)


def _as_text(hint: Hint | None) -> Hint | None:
    """A count for a flag that also takes words (``--nnodes 1:4``, ``--nproc-per-node auto``)."""
    return None if hint is None else Hint(hint.flag, str(hint.value), hint.variable,
                                          hint.scheduler)


def _present(hints: list[Hint | None]) -> tuple[Hint, ...]:
    return tuple(hint for hint in hints if hint is not None)


def _number(env: Env, variable: str | None, flag: str, scheduler: str, *, minimum: int
            ) -> Hint | None:
    value = _whole(env, variable, scheduler, minimum=minimum,
                   fix=f"or pass {FLAGS[flag]}")
    return None if value is None else Hint(flag, value, f"{variable}={value}", scheduler)


def _whole(env: Env, variable: str | None, scheduler: str, *, minimum: int, fix: str
           ) -> int | None:
    """The variable's whole number (None: unset or empty); ``fix`` ends the refusal."""
    raw = env.get(variable, "").strip() if variable else ""
    if not variable or not raw:
        return None
    if not re.fullmatch(r"\d+", raw) or int(raw) < minimum:
        raise ConfigError(
            f"{variable}={env[variable]!r} is not a whole number of at least {minimum}: "
            f"{scheduler} sets one; unset or fix the one exported by hand, {fix}")
    return int(raw)


def _port(env: Env, variable: str, scheduler: str) -> Hint | None:
    port = _number(env, variable, "master_port", scheduler, minimum=1)
    if port is not None and int(port.value) > 65535:
        raise ConfigError(f"{port.variable} is not a TCP port (1..65535): unset or fix it, "
                          "or pass --master-port")
    return port


def _text(env: Env, variable: str, flag: str, scheduler: str, pattern: str, rule: str
          ) -> Hint | None:
    raw = env.get(variable, "").strip()
    if not raw:
        return None
    if not re.fullmatch(pattern, raw):
        raise ConfigError(
            f"{variable}={env[variable]!r} is not {rule}: {scheduler} sets it for "
            f"{FLAGS[flag]}; unset or fix the one exported by hand, or pass {FLAGS[flag]}")
    return Hint(flag, raw, f"{variable}={raw}", scheduler)
