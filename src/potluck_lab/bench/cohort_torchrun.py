"""The torchrun contender of ``potluck bench cohort``: torch DDP restarting from
checkpoints, what a user would pick today.

Each host runs the real torchrun (``python -m torch.distributed.run --nnodes 3:4
--nproc-per-node 1 --rdzv-backend c10d``) with one worker of ``cohort_ddp_job``; the
rendezvous store is on host 0. torchrun's rendezvous settings are its defaults, but
for a store read's timeout (10 minutes: loaded machines start far apart). The
faults fall at the same fractions of the training as for potluck (the newest committed
step's position):

- the attacker's worker sends its gradient times -10 for the stretch (a comm hook);
- the killed worker's machine is lost (its agent and worker SIGKILLed): the others'
  all-reduce fails and torchrun restarts every worker, 3 nodes, from the newest
  checkpoint; the machine comes back as a new torchrun agent, and torchrun restarts
  every worker again, 4 nodes;
- the throttle caps a link, as for potluck;
- the store's host is lost: torchrun's rendezvous dies with it. The harness does what
  a user would, at once: it stops the survivors' agents and starts the job again on
  them, the rendezvous on the lowest surviving host, from their newest checkpoint.

The run ends once every fault fell and the held-out loss reached the target (a stop
file names the last step), or at its time limit: the target is then "not reached".
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from potluck_lab.bench import cohort_figures as fig
from potluck_lab.bench import cohort_links as links
from potluck_lab.bench.cohort_plan import (
    LINKS_MBIT,
    QUOTAS,
    CohortConfig,
    Fault,
    attack_rounds,
    due,
    schedule,
)
from potluck_lab.jobs import Processes, kill_tree, process_tree, wait_all
from potluck_lab.machine.cpu_quota import CgroupError, CpuQuota, join
from potluck_lab.machine.netns import BridgedHosts

MAX_RESTARTS = 50  # torchrun's --max-restarts: every fault may cost one or two
# A store read's timeout: the machines here start a minute or more apart when loaded,
# and torchrun's 60 s made the agents give up before host 0's store was up
READ_TIMEOUT_S = 600
POLL_S = 0.2
END_S = 30.0  # after the stop step, for the workers to finish and the agents to exit


def ddp_job_args(config: CohortConfig, host: int, run_dir: Path,
                 attack: tuple[int, tuple[int, int]]) -> list[str]:
    """``cohort_ddp_job``'s arguments on host ``host`` (the attacker's get its steps)."""
    argv = ["-m", "potluck_lab.cohort_ddp_job", "--run-dir", str(run_dir), "--node-dir",
            str(run_dir / f"checkpoints{host}"), "--host", str(host),
            "--epochs", str(config.max_epochs), "--stop-file", str(run_dir / "stop"),
            "--samples", str(config.samples), "--global-batch", str(config.global_batch),
            "--d-model", str(config.d_model), "--layers", str(config.layers),
            "--corpus-chars", str(config.corpus_chars), "--seed", str(config.seed),
            "--eval-every", str(config.eval_every),
            "--checkpoint-every", str(config.checkpoint_every)]
    node, (first, last) = attack
    if host == node:
        argv += ["--attack-steps", f"{first}:{last}"]
    return argv


def attack_steps(fault: Fault, total_steps: int) -> tuple[int, int]:
    """The global steps ``[first, last)`` (from 0) an attack covers."""
    first, last = attack_rounds(fault, total_steps)  # (rounds from 1: a step each)
    return first - 1, last - 1


class TorchrunCohort:
    """One torchrun run on the cohort's hosts: the agents, the quotas, the faults."""

    def __init__(self, hosts: BridgedHosts, quotas: list[CpuQuota], config: CohortConfig,
                 workdir: Path, limit_s: float) -> None:
        self.hosts, self.quotas, self.config, self.limit_s = hosts, quotas, config, limit_s
        self.run_dir = workdir / "torchrun"
        self.run_dir.mkdir(parents=True)
        self.procs = Processes()
        self.agents: dict[int, int] = {}  # host -> index in procs of its live agent
        self.endpoint = 0  # the host of the rendezvous store
        self.launch = 0  # the job's launches: one more after the store's host is lost
        self.port = 31000 + os.getpid() % 2000
        self.faults = schedule(config.seed)
        self.fired: list[tuple[Fault, float, float]] = []  # (fault, at progress, wall)
        self.started = 0.0
        self.quotas_on = False
        self.coming: dict[int, float] = {}  # host -> when its new agent started
        self.gave_up_s: float | None = None  # when every agent exited with the job unfinished
        self.total_steps = config.samples * config.epochs // config.global_batch
        attack = next(f for f in self.faults if f.kind == "attack")
        self.attack = (attack.node, attack_steps(attack, self.total_steps))

    def start_agent(self, host: int) -> None:
        address = self.hosts.addresses[host]
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "3:4",
                "--nproc-per-node", "1", "--max-restarts", str(MAX_RESTARTS),
                "--rdzv-backend", "c10d", "--rdzv-id", f"cohort-torchrun-{self.launch}",
                "--rdzv-endpoint", f"{self.hosts.addresses[self.endpoint]}:{self.port}",
                # (in a namespace the host's name resolves elsewhere: say who hosts it)
                "--rdzv-conf", ",".join([f"is_host={int(host == self.endpoint)}",
                                         f"read_timeout={READ_TIMEOUT_S}",
                                         *self.config.torchrun_rdzv_conf]),
                "--local-addr", address,
                *ddp_job_args(self.config, host, self.run_dir, self.attack)]
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "GLOO_SOCKET_IFNAME": self.hosts.devices[host],
               # a restarted group must not read the last attempt's Gloo addresses
               # (pytorch/pytorch#135712): users turn the sharing off
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        log = self.run_dir / f"agent{host}-{len(self.procs.procs)}.log"
        self.procs.start(self.hosts.command(host, argv), log, env=env)
        self.agents[host] = len(self.procs.procs) - 1

    def run(self) -> dict[str, Any]:
        before = links.shape(self.hosts, self.quotas)
        self.started = time.time()
        try:
            for host in range(4):
                self.start_agent(host)
            self._follow()
        finally:
            for host in list(self.agents):
                self._lose(host)
            self.procs.stop(grace=2.0, terminate=True)
        return self._figures(links.carried(self.hosts, before))

    def _follow(self) -> None:
        deadline = time.monotonic() + self.limit_s
        target = self.config.target_loss
        while time.monotonic() < deadline:
            workers = fig.read_workers(self.run_dir)
            step = max((r["steps"] for w in workers for r in w.of("commit")), default=0)
            if not self.quotas_on and step:
                self._quotas()
            self._admit(workers)
            progress = step / self.total_steps
            for fault in ([] if self.coming else due(self.faults, len(self.fired),
                                                     progress))[:1]:
                self.fired.append((fault, progress, time.time() - self.started))
                self._fire(fault)
            reached = fig.time_to_target(workers, target, self.started) is not None
            if len(self.fired) == len(self.faults) and reached:
                self._stop_at(step + 2)
            live = [self.procs.procs[i] for i in self.agents.values()]
            if all(proc.poll() is not None for proc in live):
                ended = fig.read_workers(self.run_dir)  # (a "done" written meanwhile)
                if not any(w.of("done") for w in ended):  # torchrun gave up
                    self.gave_up_s = time.time() - self.started
                return
            if any(w.of("done") for w in workers):
                wait_all(live, max(0.0, min(END_S, deadline - time.monotonic())))
                return
            time.sleep(POLL_S)

    def _stop_at(self, step: int) -> None:
        """Every worker reads the file before each step: all stop after ``step``."""
        stop = self.run_dir / "stop"
        if not stop.exists():
            temporary = stop.with_suffix(".tmp")
            temporary.write_text(str(step))
            temporary.replace(stop)

    def _quotas(self) -> None:
        for host, fraction in enumerate(QUOTAS):
            self.quotas[host].set(fraction)
        for host in self.agents:
            self._join(host)
        self.quotas_on = True

    def _join(self, host: int) -> None:
        """Host ``host``'s agent and worker into its quota (the workers torchrun starts
        again later are the agent's children: they start inside)."""
        for pid in process_tree(self.procs.procs[self.agents[host]].pid):
            with contextlib.suppress(CgroupError):  # (it ended meanwhile)
                join(self.quotas[host].path, pid)

    def _admit(self, workers: list[fig.Worker]) -> None:
        """A machine that came back is in once its worker committed a step; its quota
        starts then (as potluck's), and the next fault waits until then."""
        for host, since in list(self.coming.items()):
            if any(w.node == host and r["at"] > since for w in workers for r in w.of("commit")):
                del self.coming[host]
                if self.quotas_on:
                    self._join(host)

    def _fire(self, fault: Fault) -> None:
        if fault.kind == "kill":
            self._lose(fault.node)
        elif fault.kind == "restart":
            self.start_agent(fault.node)
            self.coming[fault.node] = time.time()
        elif fault.kind == "throttle":
            self.hosts.limit(f"{fault.mbit:g}mbit", [fault.node])
        elif fault.kind == "store_host":
            self.hosts.cut(fault.node)
            self._lose(fault.node)
            self._relaunch()

    def _lose(self, host: int) -> None:
        """Host ``host``'s agent and its workers are gone (torchrun starts its workers in
        sessions of their own: the agent's whole tree is killed)."""
        proc = self.procs.procs[self.agents.pop(host)]
        if proc.poll() is None:  # (not reaped yet: the pid is still its own)
            kill_tree(proc.pid)

    def _relaunch(self) -> None:
        """The job again on the surviving hosts, the rendezvous on the lowest of them,
        each worker from the newest checkpoint (the user's restart)."""
        survivors = sorted(self.agents)
        for host in survivors:
            self._lose(host)
        self.launch += 1
        self.endpoint, self.port = survivors[0], self.port + 1
        for host in survivors:
            self.start_agent(host)
            if self.quotas_on and host not in self.coming:
                self._join(host)

    def _figures(self, link_bytes: list[tuple[int, int]]) -> dict[str, Any]:
        c = self.config
        workers = fig.read_workers(self.run_dir)
        finishers = [w for w in workers if w.params is not None]
        equal = fig.replicas_equal(torch.load(w.params) for w in finishers
                                   if w.params is not None)
        redone = fig.steps_redone(workers)
        at_faults = fig.redone_at_faults(redone, [self.started + s for _, _, s in self.fired])
        return {
            "contender": "torchrun", "mode": "ddp",
            "time_to_target_s": fig.time_to_target(workers, c.target_loss, self.started),
            "limit_s": self.limit_s, "gave_up_s": self.gave_up_s,
            "wall_s": max((r["at"] for w in workers for r in w.records), default=self.started)
            - self.started,
            "exactly_once": None, "samples_twice": None, "samples_lost": None,
            "replicas_equal": equal, "finishers": len(finishers), "quarantine": None,
            "honest_quarantined": [], "attack_steps": list(self.attack[1]),
            "restarts": len(redone), "steps_redone": sum(s for _, s in redone),
            "samples_redone": sum(s for _, s in redone) * c.global_batch,
            "faults": [{"fault": f.describe(), "kind": f.kind, "node": f.node,
                        "at_progress": round(p, 3), "at_s": round(s, 2),
                        "steps_redone": n, "samples_redone": n * c.global_batch}
                       for (f, p, s), n in zip(self.fired, at_faults, strict=True)],
            "link_bytes": [{"host": h, "mbit": LINKS_MBIT[h], "sent": tx, "received": rx}
                           for h, (tx, rx) in enumerate(link_bytes)],
            "final_loss": next((loss for _, loss in reversed(
                fig.loss_curve(workers, self.started))), None),
            "logs": str(self.run_dir),
        }
