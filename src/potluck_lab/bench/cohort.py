"""``potluck bench cohort``: the potluck cohort, uneven, unreliable, far apart and not
all honest, with nobody a reliable node 0.

    potluck bench cohort [--quick] [--seed S] [--contenders A,B] [--limit S] [--json PATH]

Four hosts in network namespaces on a switch (``machine/netns.py``), links of 100, 20,
10 and 5 Mbit/s both ways (``tc tbf``), CPU quotas of 1.0, 0.7, 0.5 and 0.3 of a core
(cgroup v1, from the first committed step: the machines are slow, their start-up is
not what is compared). Each host runs ``potluck run --elastic`` with one worker of
``cohort_job`` (the demo's character transformer), the store on host 0. The faults
fall at fractions of the training (``cohort_plan``): an attacker for a stretch, a
worker SIGKILLed and its machine back later as a new node, a link throttled, the
store's host lost (its link cut, its processes killed).

Contenders, one after the other on the same hosts and faults:

- ``potluck``: the modes this world calls for: DiLoCo rounds planned by speed, int8
  pseudo-gradients, trust at the round's edge, the store surviving its host;
- ``potluck-step``: every-step sync, no trust (elastic, the store surviving its host).

Each trains the same samples; the report: time to the target held-out loss, every
sample exactly once (ledgers), replicas equal at the end, the attacker's quarantine
(rounds from its first corrupted one), samples never trained, bytes on each link.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from potluck.errors import ConfigError
from potluck_lab.bench import cohort_figures as fig
from potluck_lab.bench import cohort_links as links
from potluck_lab.bench import cohort_report as report
from potluck_lab.bench import cohort_story as story
from potluck_lab.bench.cohort_costs import Fired, fault_costs, link_costs
from potluck_lab.bench.cohort_plan import (
    CONTENDERS,
    HALT_S,
    LINKS_MBIT,
    QUICK,
    QUOTAS,
    CohortConfig,
    Fault,
    attack_rounds,
    due,
    schedule,
    torchrun_limit,
)
from potluck_lab.bench.cohort_torchrun import TorchrunCohort
from potluck_lab.driver import Bench, drive
from potluck_lab.jobs import Processes, kill_group, process_tree, wait_all
from potluck_lab.machine.cpu_quota import CpuQuota, join
from potluck_lab.machine.netns import BridgedHosts, unavailable

MODES = {"potluck": "rounds", "potluck-step": "step"}
SHARES = 16384  # a host's CPU weight against other processes on this machine
OBSERVER = 4  # the host a person watches the status page from (no cap, no quota)
POLL_S = 0.2
MOVED_SHOT_S = 1.0  # a commit this long after the store's host is lost: capture
END_S = 20.0  # once the job is over, for the agents to exit before they are stopped


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="potluck alone, a tiny model, the same faults and checks")
    parser.add_argument("--seed", type=int, default=0,
                        help="the faults' schedule, and the job's corpus, held-out batch and "
                             "model (the default target is seed 0's: give another seed its "
                             "own with --target-loss)")
    parser.add_argument("--target-loss", type=float, metavar="L",
                        help="the held-out loss the contenders race to (default: 2.6; "
                             "--quick: 3.2)")
    parser.add_argument("--contenders", metavar="A,B",
                        help=f"of {', '.join(CONTENDERS)} (default: all; --quick: potluck)")
    parser.add_argument("--limit", type=float, metavar="S",
                        help="seconds a potluck contender may run before it is halted at "
                             "its next commit but one (default 1800; --quick: 150)")
    parser.add_argument("--torchrun-limit", type=float, metavar="S",
                        help="seconds torchrun may run (default: 30 times potluck's time to "
                             "the target where potluck ran first and reached it, else --limit)")
    parser.add_argument("--logs", metavar="DIR", help="keep the workers' output here")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")


def configure(args: argparse.Namespace) -> CohortConfig:
    config = QUICK if args.quick else CohortConfig()
    config = replace(config, seed=args.seed, logs=args.logs)
    if args.contenders:
        names = tuple(n.strip() for n in args.contenders.split(",") if n.strip())
        wrong = [n for n in names if n not in CONTENDERS]
        if wrong or not names:
            raise ConfigError(f"--contenders {args.contenders!r}: name some of "
                              f"{', '.join(CONTENDERS)}, comma-separated")
        config = replace(config, contenders=names)
    if args.target_loss is not None:
        if not args.target_loss > 0:
            raise ConfigError(f"--target-loss {args.target_loss:g}: give a positive held-out "
                              "loss, e.g. --target-loss 2.75")
        config = replace(config, target_loss=args.target_loss)
    if args.limit is not None:
        if not args.limit > 0:
            raise ConfigError(f"--limit {args.limit:g}: give a positive number of seconds, "
                              "e.g. --limit 900")
        config = replace(config, limit_s=args.limit)
    if args.torchrun_limit is not None:
        if not args.torchrun_limit > 0:
            raise ConfigError(f"--torchrun-limit {args.torchrun_limit:g}: give a positive "
                              "number of seconds, e.g. --torchrun-limit 3600")
        config = replace(config, torchrun_limit_s=args.torchrun_limit)
    if args.seed < 0:
        raise ConfigError(f"--seed {args.seed}: a seed is >= 0")
    return config


def job_args(config: CohortConfig, mode: str, run_dir: Path,
             attack: tuple[int, tuple[int, int]] | None) -> list[str]:
    argv = ["-m", "potluck_lab.cohort_job", "--run-dir", str(run_dir), "--mode", mode,
            "--epochs", str(config.max_epochs), "--stop-file", str(run_dir / "stop"),
            "--samples", str(config.samples),
            "--global-batch", str(config.global_batch), "--inner-steps",
            str(config.inner_steps), "--d-model", str(config.d_model), "--layers",
            str(config.layers), "--corpus-chars", str(config.corpus_chars),
            "--seed", str(config.seed), "--halt-file", str(run_dir / "halt")]
    if attack is not None:
        node, (first, last) = attack
        argv += ["--attacker-node", str(node), "--attack-rounds", f"{first}:{last}"]
    return argv


class Cohort:
    """One contender's run: the agents, the quotas, the faults as they fall."""

    def __init__(self, hosts: BridgedHosts, quotas: list[CpuQuota], config: CohortConfig,
                 name: str, workdir: Path) -> None:
        self.hosts, self.quotas, self.config, self.name = hosts, quotas, config, name
        self.run_dir = workdir / name
        self.run_dir.mkdir(parents=True)
        self.mode = MODES[name]
        self.procs = Processes()
        self.agents: dict[int, int] = {}  # node rank -> index in procs
        self.host_of: dict[int, int] = {}  # node rank -> host
        self.port = 29000 + (os.getpid() * 7 + len(name)) % 3000
        self.faults = schedule(config.seed)
        self.fired: list[tuple[Fault, float, float]] = []  # (fault, at progress, wall)
        self.started = 0.0
        self.quotas_on = False
        self.restarted: set[int] = set()  # node ranks of machines that came back
        self.joined: set[int] = set()  # ... and are members again
        self.status_port = self.port + 1  # every agent's --status-port (own namespace)
        self.story = story.Story(hosts, OBSERVER, self.run_dir, 0.0)
        self.moved_shot = False
        self.halted_at: int | None = None  # the commit the run was told to end at
        self.halted_s: float | None = None  # when, since the start
        self.halt_missed = False  # ... and it had not ended HALT_S later
        total_rounds = config.samples * config.epochs // config.commits_per_round  # nominal
        attack = next(f for f in self.faults if f.kind == "attack")
        self.attack = (attack.node, attack_rounds(attack, total_rounds)) \
            if self.mode == "rounds" else None

    def start_node(self, rank: int, host: int) -> None:
        c = self.config
        argv = [sys.executable, "-m", "potluck", "run", "--elastic", "--nnodes", "4:6",
                "--node-rank", str(rank), "--nproc-per-node", "1", "--master-addr",
                self.hosts.addresses[0], "--master-port", str(self.port), "--token",
                "potluck-cohort-bench", "--run-id", f"cohort-{self.name}", "--max-restarts",
                "0", "--join-timeout", "120", "--no-warm-spare", "--log-dir",
                str(self.run_dir / f"worker-logs{rank}"), "--status-port",
                str(self.status_port), "--status-host", "0.0.0.0", "--metrics-dir",
                str(self.run_dir / "metrics"),
                *job_args(c, self.mode, self.run_dir, self.attack)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.procs.start(self.hosts.command(host, argv), self.run_dir / f"agent{rank}.log",
                                env=env)
        self.agents[rank], self.host_of[rank] = len(self.procs.procs) - 1, host

    def run(self) -> dict[str, Any]:
        before = links.shape(self.hosts, self.quotas)
        self.started = time.time()
        self.story.started = self.started
        try:
            for rank in range(4):
                self.start_node(rank, rank)
            self._follow()
        finally:
            self.procs.stop(grace=2.0, terminate=True)
        return self._figures(links.carried(self.hosts, before))

    def _follow(self) -> None:
        c = self.config
        total = c.samples * c.epochs
        deadline = time.monotonic() + c.limit_s
        while True:
            workers = fig.read_workers(self.run_dir)
            now = time.monotonic()
            if now >= deadline + (HALT_S if self.halted_at is not None else 0.0):
                if self.halted_at is not None:
                    self.halt_missed = True  # (the run's figures say it; torchrun still runs)
                    return
                self._halt(workers)
            committed = fig.committed_samples(workers)
            if not self.quotas_on and committed:
                self._quotas()
            # (no fault once halted: the run's last commits end it)
            ready = [] if self._joining(workers) or self.halted_at is not None \
                else due(self.faults, len(self.fired), committed / total)
            for fault in ready[:1]:
                self._fire(fault, workers)
                self.fired.append((fault, committed / total, time.time() - self.started))
            # (--quick checks no time: its run ends an epoch after the faults, within
            # its limit; a full run, after the target too, or at its max_epochs)
            reached = c.quick or fig.time_to_target(workers, c.target_loss,
                                                    self.started) is not None
            if len(self.fired) == len(self.faults) and not self._joining(workers) \
                    and reached:
                self._stop_after(workers)
            self._watch_moved_page(workers)
            if all(self.procs.procs[i].poll() is not None for i in self.agents.values()):
                return
            if any(r.get("finished") for w in workers for r in w.of("done")):
                # the job is over: an agent still waiting to join will not be let in
                # (not a machine back that never got in: it waits out its join timeout)
                wait_all([self.procs.procs[i] for rank, i in self.agents.items()
                          if rank not in self.restarted - self.joined], END_S)
                return
            time.sleep(POLL_S)

    def _halt(self, workers: list[fig.Worker]) -> None:
        """The run is at its limit: every worker ends after a commit two past the newest
        logged, mid-epoch. No worker is past it: each logs commit k before it takes
        part in step k + 1, so commit k + 2 needs a line for k + 1 not read yet. And
        every worker reads the file before each step, where all count the same commits."""
        newest = max((r["steps"] for w in workers for r in w.of("commit")), default=0)
        self.halted_at = newest + 2
        self.halted_s = time.time() - self.started
        _write_whole(self.run_dir / "halt", str(self.halted_at))
        print(f"{self.name}: at its limit of {self.config.limit_s:g} s: halting after "
              f"commit {self.halted_at}", flush=True)

    def _stop_after(self, workers: list[fig.Worker]) -> None:
        """Every fault fell (and, in a full run, the target was reached): the job ends
        after the epoch after the current one (every worker reads the file before each
        step, so all stop at that epoch's end)."""
        stop = self.run_dir / "stop"
        if stop.exists():
            return
        epoch = max((e for w in workers for e, _ in w.ledger), default=0)
        _write_whole(stop, str(min(self.config.max_epochs, epoch + 2)))

    def epochs_trained(self) -> int:
        stop = self.run_dir / "stop"
        return int(stop.read_text()) if stop.exists() else self.config.max_epochs

    def _joining(self, workers: list[fig.Worker]) -> bool:
        """Whether a restarted machine is still on its way in (its worker has not
        committed a step yet): the next fault waits for it (a cohort of 2 that loses
        one more member has no majority left; the partition rule stops it, by design).
        Its host's quota starts once it is in."""
        for rank in self.restarted - self.joined:
            if any(w.node == rank and w.of("commit") for w in workers):
                self.joined.add(rank)
                for pid in process_tree(self.procs.procs[self.agents[rank]].pid):
                    join(self.quotas[self.host_of[rank]].path, pid)
        return bool(self.restarted - self.joined)

    def _quotas(self) -> None:
        for host, fraction in enumerate(QUOTAS):
            self.quotas[host].set(fraction)
        for rank, index in self.agents.items():
            for pid in process_tree(self.procs.procs[index].pid):
                join(self.quotas[self.host_of[rank]].path, pid)
        self.quotas_on = True

    def _fire(self, fault: Fault, workers: list[fig.Worker]) -> None:
        if fault.kind == "kill":
            for pid in _worker_pids(self.run_dir, fault.node):
                _kill(pid)
        elif fault.kind == "restart":
            rank = max(self.agents) + 1
            self.start_node(rank, fault.node)
            self.restarted.add(rank)
        elif fault.kind == "throttle":
            self.hosts.limit(f"{fault.mbit:g}mbit", [fault.node])
        elif fault.kind == "store_host":
            self.story.capture("before-store-loss", 0, self.status_port)
            self.hosts.cut(0)
            kill_group(self.procs.procs[self.agents[0]])

    def _watch_moved_page(self, workers: list[fig.Worker]) -> None:
        """Once the store's host is lost and an agent serves the page where the store
        moved, capture it there, after the survivors' first commit a second past the
        loss (their pulses are on it by then)."""
        if self.moved_shot or not any(f.kind == "store_host" for f, _, _ in self.fired):
            return
        lost_at = self.started + next(s for f, _, s in self.fired if f.kind == "store_host")
        if not any(r["at"] > lost_at + MOVED_SHOT_S for w in workers for r in w.of("commit")):
            return
        for rank in self.agents:
            log = self.run_dir / f"agent{rank}.log"
            port = story.served_port(log.read_text(errors="replace")) if rank else None
            if port is not None:
                self.story.capture("after-store-moved", self.host_of[rank], port)
                self.moved_shot = True
                return

    def _figures(self, link_bytes: list[tuple[int, int]]) -> dict[str, Any]:
        c = self.config
        workers = fig.read_workers(self.run_dir)
        # (halted mid-epoch: its last epoch is not checked for samples never trained)
        epochs = self.epochs_trained() if self.halted_at is None \
            else min(self.epochs_trained(), fig.whole_epochs(workers))
        once = fig.exactly_once(workers, c.samples, epochs)
        finishers = [w for w in workers if w.params is not None]
        equal = fig.replicas_equal(torch.load(w.params) for w in finishers
                                   if w.params is not None)
        caught = fig.quarantine(workers, self.attack[0], self.run_dir / "metrics") \
            if self.attack else None
        pictures, no_plots = story.plots(self.run_dir / "metrics", self.run_dir / "plots")
        wall = max((r["at"] for w in workers for r in w.records), default=self.started) \
            - self.started
        return {
            "contender": self.name, "mode": self.mode,
            "time_to_target_s": fig.time_to_target(workers, c.target_loss, self.started),
            "wall_s": wall,
            "exactly_once": once["twice"] == 0 and once["missing"] == 0,
            "epochs": epochs, "limit_s": c.limit_s, "halted_at": self.halted_at,
            "halted_s": self.halted_s, "halt_missed": self.halt_missed,
            "samples_twice": once["twice"], "samples_lost": once["missing"],
            "replicas_equal": equal, "finishers": len(finishers),
            "quarantine": caught,
            "honest_quarantined": fig.honest_quarantines(
                workers, self.attack[0] if self.attack else None),
            "faults": [{"fault": f.describe(), "kind": f.kind, "node": f.node,
                        "at_progress": round(p, 3), "at_s": round(s, 2)}
                       for f, p, s in self.fired],
            "link_bytes": [{"host": h, "mbit": LINKS_MBIT[h], "sent": tx, "received": rx}
                           for h, (tx, rx) in enumerate(link_bytes)],
            "final_loss": next((loss for _, loss in reversed(
                fig.loss_curve(workers, self.started))), None),
            "fault_costs": fault_costs(workers, [Fired(f, s) for f, _, s in self.fired],
                                       self.started),
            "link_costs": link_costs(link_bytes, LINKS_MBIT, wall),
            "status_shots": [shot.record() for shot in self.story.shots],
            "plots": [str(path) for path in pictures], "no_plots": no_plots,
            "logs": str(self.run_dir),
        }


def _write_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` at once: a worker reading it sees all of it or no file."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def _worker_pids(run_dir: Path, node: int) -> list[int]:
    """The pids of node ``node``'s workers (``node<N>-<pid>.log``) still running."""
    pids = [int(p.stem.split("-")[1]) for p in run_dir.glob(f"node{node}-*.log")]
    return [pid for pid in pids if Path(f"/proc/{pid}").exists()]


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # (it ended meanwhile)
        os.kill(pid, signal.SIGKILL)


def measure(config: CohortConfig, logs: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"runs": []}
    hosts = BridgedHosts(5, prefix="pl-coh")  # (host 4: the observer)
    quotas = [CpuQuota(f"potluck-cohort-{os.getpid()}-{h}", shares=SHARES) for h in range(4)]
    with hosts:
        made = []
        try:
            for quota in quotas:
                made.append(quota.create(None))
            for name in order(config.contenders):
                print(f"{name}: running ...", flush=True)
                if name == "torchrun":
                    potluck = next((r for r in results["runs"] if r["contender"] == "potluck"),
                                   None)
                    limit = torchrun_limit(config, potluck and potluck["time_to_target_s"])
                    run = TorchrunCohort(hosts, quotas, config, logs, limit).run()
                else:
                    run = Cohort(hosts, quotas, config, name, logs).run()
                results["runs"].append(run)
                print(report.line(run), flush=True)
        finally:
            for quota in made:
                quota.remove()
    return results


def order(names: tuple[str, ...]) -> list[str]:
    """The contenders in their order, torchrun last (its limit is from potluck's run)."""
    return sorted(names, key=lambda name: name == "torchrun")


def _unavailable() -> str | None:
    from potluck_lab.machine.cpu_quota import unavailable as no_quota

    return unavailable(tools=("ip", "tc")) or no_quota()


def main(args: argparse.Namespace) -> int:
    return drive(BENCH, args)


BENCH = Bench("cohort", configure, measure, report.lines, report.payload,
              header=lambda c: (f"potluck bench cohort: 4 hosts, links {LINKS_MBIT} Mbit/s, "
                                f"quotas {QUOTAS} core, {c.samples} samples x {c.epochs}, "
                                f"global batch {c.global_batch}, H={c.inner_steps}, target "
                                f"held-out loss {c.target_loss:g}"),
              unavailable=_unavailable, logs=lambda config: config.logs,
              exit_code=report.exit_code)
