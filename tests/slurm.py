"""A real single-node SLURM cluster for tests: install it, start it, stop it clean.

What works (Debian 12's ``slurm-wlm`` 22.05, as root, no systemd): ``slurmctld -D`` and
``slurmd -D -N localhost`` in the foreground, on a ``slurm.conf`` in a temp directory
that every command finds through ``SLURM_CONF``. ``auth/none`` and ``cred/none`` stand in
for munge, so no munged runs and no key is needed. ``proctrack/pgid`` and ``task/none``
need no cgroups. The node is ``localhost`` at 127.0.0.1, so ``SLURM_NODELIST`` names a
host that resolves. slurmd logs that it cannot load PMIx; that is harmless.

A step's ``slurmstepd`` leaves slurmd's process tree (its parent becomes init), so
``stop`` finds what the cluster started by the ``SLURM_CONF`` in its environment.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path

from potluck.testing import free_port
from tests import apt

START_TIMEOUT_S = 30.0
BINARIES = ("slurmctld", "slurmd", "srun", "sbatch", "sinfo", "squeue", "scancel")
_UNFINISHED = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}


def why_no_slurm() -> str | None:
    """Why there is no SLURM to start here, after trying to install it; None: there is."""
    if _missing():
        why = apt.why_not_installable()
        if why is not None:
            return f"SLURM is not installed ({', '.join(_missing())} missing) and {why}"
        failure = apt.install("slurm-wlm", lambda: not _missing())
        if failure is not None:
            return f"apt-get install slurm-wlm failed: {failure}"
    if os.geteuid() != 0:
        return "not root, so slurmd cannot start jobs"
    return None


@contextlib.contextmanager
def cluster(root: Path, cpus: int = 2) -> Iterator[dict[str, str]]:
    """A running controller and one node of ``cpus`` CPUs; yields the environment that
    points ``srun``/``sbatch`` at it. Every process it started is gone when it exits."""
    conf = _write_conf(root, cpus)
    env = {**os.environ, "SLURM_CONF": str(conf),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        for argv in (["slurmctld", "-D", "-i", "-f", str(conf)],
                     ["slurmd", "-D", "-N", "localhost", "-f", str(conf)]):
            log = (root / f"{argv[0]}.out").open("wb")
            daemons.append(subprocess.Popen(argv, env=env, stdout=log, stderr=log,
                                            stdin=subprocess.DEVNULL, start_new_session=True))
            log.close()
        _wait_idle(env, daemons, root)
        yield env
    finally:
        _stop(env, conf, daemons)


def wait_job(env: Mapping[str, str], job: str, timeout: float) -> tuple[str, str]:
    """A batch job's final state and exit code, e.g. ("COMPLETED", "0:0"). Polled twice
    a second: ``sbatch --wait`` backs off to tens of seconds between its own polls."""
    deadline = time.monotonic() + timeout
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "job", "-o", job], env=env,
                               capture_output=True, text=True, timeout=10, check=False)
        fields = dict(word.split("=", 1) for word in shown.stdout.split() if "=" in word)
        if fields.get("JobState", "PENDING") not in _UNFINISHED:
            return fields["JobState"], fields.get("ExitCode", "?")
        time.sleep(0.5)
    raise TimeoutError(f"job {job} still {fields.get('JobState')} after {timeout:.0f} s")


def logs(root: Path) -> str:
    """The daemons' logs, for a failing test's message."""
    parts = []
    for name in ("slurmctld.out", "slurmd.out", "slurmctld.log", "slurmd.log"):
        path = root / name
        if path.is_file():
            parts.append(f"--- {name}\n" + "\n".join(path.read_text().splitlines()[-15:]))
    return "\n".join(parts)


def _missing() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def _write_conf(root: Path, cpus: int) -> Path:
    for name in ("state", "spool"):
        (root / name).mkdir(parents=True, exist_ok=True)
    controller, node = free_port(), free_port()
    while node == controller:
        node = free_port()
    lines = {
        "ClusterName": "potluck", "SlurmctldHost": "localhost(127.0.0.1)",
        "SlurmctldPort": controller, "SlurmdPort": node,
        "SlurmUser": "root", "SlurmdUser": "root",
        "AuthType": "auth/none", "CredType": "cred/none", "MpiDefault": "none",
        "ProctrackType": "proctrack/pgid", "TaskPlugin": "task/none",
        "SelectType": "select/cons_tres", "SelectTypeParameters": "CR_CPU",
        "ReturnToService": 2, "JobAcctGatherType": "jobacct_gather/none",
        "AccountingStorageType": "accounting_storage/none",
        "StateSaveLocation": root / "state", "SlurmdSpoolDir": root / "spool",
        "SlurmctldPidFile": root / "slurmctld.pid", "SlurmdPidFile": root / "slurmd.pid",
        "SlurmctldLogFile": root / "slurmctld.log", "SlurmdLogFile": root / "slurmd.log",
        "NodeName": f"localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        "PartitionName": "debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    }
    conf = root / "slurm.conf"
    conf.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
    return conf


def _wait_idle(env: Mapping[str, str], daemons: list[subprocess.Popen[bytes]],
               root: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        dead = [str(d.args[0]) for d in daemons if d.poll() is not None]  # type: ignore[index]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited at start\n{logs(root)}")
        state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                               text=True, timeout=10, check=False).stdout.strip()
        if state == "idle":
            return
        time.sleep(0.3)
    raise RuntimeError(f"the SLURM node was not idle after {START_TIMEOUT_S:.0f} s\n"
                       f"{logs(root)}")


def _stop(env: Mapping[str, str], conf: Path, daemons: list[subprocess.Popen[bytes]]
          ) -> None:
    """Cancel every job, let the steps end, stop the daemons, kill whatever is left."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True,
                              text=True, timeout=10, check=False).stdout.split()
        if jobs:
            subprocess.run(["scancel", *jobs], env=env, timeout=10, check=False)
    ours = {d.pid for d in daemons}  # and their own helpers (slurmctld's slurmscriptd)
    _wait_gone(lambda: {pid for pid, parent in _started_by(conf).items()
                        if pid not in ours and parent not in ours}, 10.0)
    for daemon in daemons:
        if daemon.poll() is None:
            daemon.terminate()
    for daemon in daemons:
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    for pid in _started_by(conf):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _wait_gone(lambda: _started_by(conf), 5.0)


def _wait_gone(alive: Callable[[], Collection[int]], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)


def _started_by(conf: Path) -> dict[int, int]:
    """Live processes whose environment points at this cluster's ``slurm.conf``: pid ->
    parent pid."""
    marker = f"SLURM_CONF={conf}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state, parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            found[int(entry.name)] = int(parent)
    return found
