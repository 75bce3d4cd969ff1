"""The local agent of ``potluck run``: start this node's workers, watch them, stop them.

One attempt starts ``nproc_per_node`` workers, each in its own session (so the whole
process tree of a worker can be signalled at once), forwards their output line by line
with a ``[rankN]:`` prefix, and returns when every worker succeeded, one failed, or the
launcher got a signal. Stopping sends SIGTERM to every worker's process group, then
SIGKILL after the grace period, and reaps everything, so no worker outlives its agent.
A worker whose script ran to its end counts as finished even if the process then died
at interpreter exit: the agent warns about it by name and never restarts a finished
training for it.
The restart decision is ``policy.next_action``; the failure report is ``report``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, TYPE_CHECKING

from potluck import env as potluck_env
from potluck import keys
from potluck.errors import BelowMinimumError, ConfigError, RendezvousError
from potluck.launch.config import LaunchConfig, Layout, static_layout, worker_environ
from potluck.launch.forked import Template
from potluck.launch.job_keys import (
    clear_for_whole_restart,
    clear_worker_keys,
    cohort_formed,
    holds_torch_keys,
    joined_cohort,
    mark_exited,
)
from potluck.launch.meeting import (
    check_in,
    elastic_offset,
    exchange_nprocs,
    publish_first_node,
    wait_for_count,
)
from potluck.launch.moved import forget
from potluck.launch.policy import Action, Outcome, next_action, not_to_restart
from potluck.launch.quiet import Quieter
from potluck.launch.report import (
    WorkerResult,
    describe_exit,
    format_report,
    format_teardown_warning,
    read_error_file,
    read_finished_file,
    root_cause,
    stop_file,
    stopped_below_minimum,
)
from potluck.launch.roll import Presence, wait_for_roll
from potluck.launch.spare import Spare, WaitingSpare, WorkerProcess
from potluck.launch.store import JobStore
from potluck.launch.sweep import Sweeper

LEARN_S = 1.0  # how often an agent reads the store's successors again

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

    from potluck.status.service import StatusService

_POLL = 0.05
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class _Worker:
    rank: int
    local_rank: int
    proc: WorkerProcess
    error_file: str
    finished_file: str
    pumps: list[threading.Thread] = field(default_factory=list)
    seen_at: float | None = None
    stopped: bool = False
    why: str | None = None
    """Why the agent ended it while it still ran (elastic: left out of the cohort)."""

    def ended_well(self, code: int) -> bool:
        """Exit code 0, or its script ran to the end before the process died anyway."""
        return code == 0 or read_finished_file(self.finished_file) is not None

    def stopped_below_minimum(self, code: int) -> bool:
        """The cohort's planned stop (not a script's own ``sys.exit(3)``)."""
        return code == BelowMinimumError.EXIT_CODE and stopped_below_minimum(self.finished_file)


class Agent:
    """Runs one node's share of a job; ``run()`` returns the launcher's exit code."""

    def __init__(
        self,
        config: LaunchConfig,
        *,
        emit: Callable[[str], None],
        stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None,
    ) -> None:
        self.config = config.validated()
        self._emit = emit
        self._sinks = (stdout or sys.stdout.buffer, stderr or sys.stderr.buffer)
        self._lock = threading.Lock()
        self._signal: int | None = None
        self._layout = Layout.assumed(self.config)  # until the nodes have met
        self._reported: set[int] = set()  # pids of workers reported lost (elastic)
        # the status page (--status-port): node 0's, or where the store moved
        self._status: StatusService | None = None
        self._status_failed = False  # the moved store's page could not start: not again
        self._template: Template | None = None  # forks warm spares (elastic, Linux)

    def run(self) -> int:
        """Run to the end: 0 on success, 1 on failure, 128 + signal when interrupted."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _STOP_SIGNALS}
        potluck_env.quiet_cpp_warnings()  # the agent's own store client; not its workers'
        try:
            return self._run()
        except RendezvousError:
            if self._signal is None:
                raise
            return 128 + self._signal  # interrupted while waiting for the other nodes
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._status is not None:
                self._status.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signal = signum

    def _stopping(self) -> bool:
        return self._signal is not None

    def _run(self) -> int:
        cfg = self.config
        # (node 0: the port is bound, no torch yet)
        job_store = JobStore(cfg, self._stopping, say=self._emit)
        if cfg.status_port is not None and cfg.node_rank == 0:
            self._serve_status(job_store.port)
        if cfg.node_rank > 0 or cfg.etcd is not None:
            job_store.get()  # reach the store before starting workers that would need it
        if cfg.elastic:
            if cfg.node_rank > 0:
                offset = elastic_offset(job_store.get(), cfg, self._stopping, say=self._emit)
                # (WORLD_SIZE: the most workers, counting this node's after the others')
                self._layout = Layout(offset, max(cfg.world_size,
                                                  offset + cfg.nproc_per_node))
            return self._run_elastic(job_store)
        restarts = 0
        while True:
            if cfg.nnodes > 1:  # ranks follow every node's worker count, told at the meeting
                key = keys.agents(cfg.run_id, f"attempt{restarts}")
                nprocs = exchange_nprocs(job_store.get(), key, cfg, self._stopping,
                                         say=self._emit)
                self._layout = static_layout(nprocs, cfg.node_rank)
            if restarts:  # every node's old workers are gone: they met (or there is one)
                self._clear_for(restarts, job_store.get())
            outcome, results = self._attempt(job_store, restarts)
            store = job_store.get()
            self._warn_teardown_deaths(results)
            if self._signal is not None:
                self._check_out(store)
                return self._interrupted(results)
            action = next_action(outcome, restarts, cfg.max_restarts)
            if action is Action.FINISH:
                self._finish(store)
                return 0
            self._emit(format_report(results, host=socket.gethostname(),
                                     node_rank=cfg.node_rank))
            self._post_exits(results, "" if action is Action.GIVE_UP
                             else f"; restarting every worker ({restarts + 1} of "
                                  f"{cfg.max_restarts} restarts)")
            if action is Action.GIVE_UP:
                self._check_out(store)
                return 1
            restarts += 1
            self._emit(f"potluck run: restarting the workers ({restarts} of "
                       f"{cfg.max_restarts} restarts)")

    def _clear_for(self, attempt: int, store: Store) -> None:
        """Before a restarted attempt's workers start on any node: node 0 deletes the
        store's keys that are not potluck's (``clear_worker_keys``) and says so; the
        other nodes wait for that word."""
        cleared = keys.agents(self.config.run_id, f"attempt{attempt}/cleared")
        if self.config.node_rank == 0:
            clear_worker_keys(store)
            store.add(cleared, 1)
        else:
            wait_for_count(store, cleared, lambda: 1, self.config.join_timeout,
                           self._stopping, fix="node 0's agent did not start the attempt: "
                                               "see node 0's output")

    def _run_elastic(self, job_store: JobStore) -> int:
        """One attempt in which dead workers are restarted one by one. Nodes do not meet
        first: the cohort's rendezvous admits each worker whenever it arrives (a node of
        ``--nnodes MIN:MAX`` beyond MIN joins the running job). A script that never
        joins the cohort (plain torch.distributed) is restarted whole instead, attempt
        after attempt, as torchrun would (``_plain_script``). At the end node 0 waits
        for the other nodes' agents that still beat (``wait_for_roll``)."""
        cfg = self.config
        presence: list[Presence] = []

        def spawned(store: Store) -> None:
            if cfg.node_rank == 0:
                publish_first_node(store, cfg)  # later nodes number their workers after
            presence.append(Presence(store, cfg))

        restarts = 0
        try:
            while True:
                outcome, results = self._attempt(
                    job_store, restarts, spawned=spawned if restarts == 0 else _nothing)
                self._warn_teardown_deaths(results)
                if outcome is not Outcome.NO_COHORT or self._signal is not None:
                    break
                if not self._plain_script(results, restarts):
                    break
                restarts += 1
                clear_for_whole_restart(job_store.get(), cfg.run_id)
        finally:
            for agent in presence:
                agent.check_out()
        store = job_store.get()
        if self._signal is not None:
            return self._interrupted(results)
        if job_store.hosting:  # keep the store up until every node's workers are done
            try:
                wait_for_roll(store, cfg.run_id, cfg.join_timeout, self._stopping,
                              lost=self._node_lost)
            except RendezvousError as exc:  # this node's outcome stands; say why we quit
                self._emit(f"potluck run: closing the store anyway: {exc}")
            try:
                job_store.delete_keys()
            except RendezvousError as exc:  # (the job's outcome stands)
                self._emit(f"potluck run: the job's keys stay in etcd: {exc}")
        if outcome is Outcome.SUCCEEDED:
            forget(cfg.run_id)  # (nothing left to guard a restarted node 0 against)
            return 0
        if outcome is Outcome.NO_COHORT:  # (reported above)
            return 1
        if outcome is Outcome.STOPPED:
            self._emit(f"potluck run: the cohort stopped below --min-workers "
                       f"{cfg.min_workers} after waiting {cfg.min_workers_timeout:g} s for "
                       "workers to join; its checkpoint is named above: start the job "
                       "again with enough workers to resume from it")
            return BelowMinimumError.EXIT_CODE
        unreported = [r for r in results if r.pid not in self._reported]
        if any(r.failed for r in unreported):
            self._emit(format_report(unreported, host=socket.gethostname(),
                                     node_rank=cfg.node_rank))
        else:  # each was reported when it was lost: say how it ended, not all again
            self._emit("potluck run: the job failed: every worker of this node was lost "
                       "(each is reported above)")
        return 1

    def _plain_script(self, results: list[WorkerResult], restarts: int) -> bool:
        """A worker of a plain torch.distributed group was lost: the script does not
        use the elastic path, and its survivors keep a group that lost a member. Report
        the attempt as torchrun would, and say whether every worker restarts together
        (one node, restarts left: True) or the job failed. Across nodes the elastic
        agents do not meet per attempt, so none restarts."""
        cfg = self.config
        budget = cfg.max_restarts if cfg.nnodes == 1 else 0
        restart = next_action(Outcome.FAILED, restarts, budget) is Action.RESTART
        self._emit(format_report(results, host=socket.gethostname(),
                                 node_rank=cfg.node_rank))
        self._post_exits(results, f"; restarting every worker ({restarts + 1} of "
                                  f"{cfg.max_restarts} restarts)" if restart else "")
        root = root_cause(results)
        who = f"worker {root.rank}" if root is not None else "a worker"
        why = (f"potluck run: {who} never joined the elastic cohort: the script does not "
               "call potluck.prepare or potluck.init() (plain torch.distributed or torch "
               "DDP), so a lost worker cannot rejoin the others' process group")
        if restart:
            self._emit(f"{why}; restarting every worker together, as torchrun does "
                       f"({restarts + 1} of {cfg.max_restarts} restarts; the same as "
                       "running it without --elastic, with --max-restarts K)")
        elif cfg.nnodes == 1:
            self._emit(f"{why}; --max-restarts {cfg.max_restarts} allows no more restarts "
                       "of the whole worker set: the job failed (--elastic adds nothing to "
                       "such a script: run it without --elastic, with --max-restarts K)")
        else:
            self._emit(f"{why}; the agents of an elastic job's nodes cannot restart every "
                       "node's workers together: the job failed. Run such a script without "
                       "--elastic, with --max-restarts K, to restart every worker of every "
                       "node together")
        return restart

    def _node_lost(self, who: str, silent: float) -> None:
        self._emit(f"potluck run: {who} is lost: its agent stopped beating {silent:.0f} s "
                   "ago (the node was killed, or cut off from node 0); the job ends "
                   "without waiting for it to check out")

    def _warn_teardown_deaths(self, results: list[WorkerResult]) -> None:
        for result in results:
            if result.died_after_finishing:
                self._emit(format_teardown_warning(result, host=socket.gethostname(),
                                                   node_rank=self.config.node_rank))

    def _interrupted(self, results: list[WorkerResult]) -> int:
        assert self._signal is not None
        name = signal.Signals(self._signal).name
        self._emit(f"potluck run: got {name}, stopped {len(results)} worker(s)")
        return 128 + self._signal

    def _finish(self, store: Store) -> None:
        # Node 0 keeps the store up until every node's workers are done with it; the
        # others only check out (waiting too would race node 0 closing the store).
        cfg = self.config
        if cfg.nnodes == 1:
            return
        key = keys.agents(cfg.run_id, "done")
        check_in(store, key)
        if cfg.node_rank == 0:
            wait_for_count(store, key, lambda: cfg.nnodes, cfg.join_timeout, self._stopping)

    def _check_out(self, store: Store) -> None:
        """A node that gave up or was interrupted is done with the store too: say so, or
        node 0, whose own workers may have succeeded, waits the whole join timeout for it.
        Node 0 itself closes the store as it exits, so nobody waits for it there."""
        cfg = self.config
        if cfg.nnodes == 1 or cfg.node_rank == 0:
            return
        with contextlib.suppress(RendezvousError):  # node 0 may be gone; our report stands
            check_in(store, keys.agents(cfg.run_id, "done"))

    # ------------------------------------------------------------------- one attempt

    def _attempt(self, job_store: JobStore, restarts: int,
                 spawned: Callable[[Store], None] = lambda store: None,
                 ) -> tuple[Outcome, list[WorkerResult]]:
        """Spawn this node's workers, then serve the store (node 0: the torch import
        overlaps theirs), then watch them to the end."""
        workers: list[_Worker] = []
        with tempfile.TemporaryDirectory(prefix="potluck-run-") as tmp:
            try:
                for local_rank in range(self.config.nproc_per_node):
                    workers.append(self._spawn(local_rank, job_store.address(), restarts,
                                               tmp))
                store = job_store.get()
                spawned(store)
                if self.config.elastic:
                    outcome = self._monitor_elastic(workers, job_store, tmp, restarts)
                else:
                    outcome = self._monitor(workers)
            finally:
                self._stop(workers)
                if self._template is not None:  # (its children are gone: stopped above)
                    self._template.close()
                    self._template = None
            results = [_result(w) for w in workers]
        return outcome, results

    def _spawn(self, local_rank: int, store: tuple[str, int, int], restarts: int, tmp: str,
               spare: WaitingSpare | None = None) -> _Worker:
        """Start the worker of ``local_rank``: ``spare`` becomes it when given and alive."""
        cfg = self.config
        error_file = os.path.join(tmp, f"error-{local_rank}.json")
        finished_file = os.path.join(tmp, f"finished-{local_rank}")
        for leftover in (finished_file, stop_file(finished_file), error_file):
            with contextlib.suppress(FileNotFoundError):  # a restarted worker's forebear's
                os.remove(leftover)
        environ = self._environ(local_rank, store, restarts, error_file, finished_file)
        proc: WorkerProcess | None = None
        if spare is not None:  # (a forked one may still be coming: not past a stop signal)
            proc = spare.take(environ, give_up=lambda: self._signal is not None)
        if proc is None:
            proc = subprocess.Popen(
                self._command(), env=environ, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            )
        rank = self._layout.rank_offset + local_rank
        worker = _Worker(rank, local_rank, proc, error_file, finished_file)
        # An elastic worker's rank in the cohort changes with the generations (its log
        # lines say "[rank R]"): its prefix names the launcher's slot instead.
        prefix = (f"[worker{rank}]: " if cfg.elastic else f"[rank{rank}]: ").encode()
        shown = cfg.local_ranks_filter is None or local_rank in cfg.local_ranks_filter
        logs = _log_files(cfg, restarts, local_rank)
        for stream, sink, log in zip((proc.stdout, proc.stderr), self._sinks, logs,
                                     strict=True):
            assert stream is not None  # PIPE was requested above
            pump = threading.Thread(
                target=self._pump, args=(stream, sink if shown else None, prefix, log),
                daemon=True,
            )
            pump.start()
            worker.pumps.append(pump)
        return worker

    def _environ(self, local_rank: int, store: tuple[str, int, int], restarts: int,
                 error_file: str, finished_file: str) -> dict[str, str]:
        """``store``: where the job's store is now, and the node hosting it (it may have
        moved from node 0)."""
        return worker_environ(
            self.config, local_rank=local_rank, master_addr=store[0], master_port=store[1],
            store_node=store[2], restart_count=restarts,
            base=potluck_env.environ_copy(), error_file=error_file, agent_pid=os.getpid(),
            finished_file=finished_file, layout=self._layout,
        )

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "potluck.launch.worker", *self._bootstrap_argv()]

    def _bootstrap_argv(self) -> list[str]:
        """The worker bootstrap's arguments: ``[-m] script args...``."""
        cfg = self.config
        target = ["-m", cfg.script] if cfg.module else [cfg.script]
        return [*target, *cfg.script_args]

    def _new_spare(self, store: tuple[str, int, int], tmp: str) -> WaitingSpare | None:
        """A warm spare for the next restart, if one can come (``--no-warm-spare``: never):
        forked by the spare template where there is one (Linux), else started afresh."""
        if not self.config.warm_spare:
            return None
        placeholder = os.path.join(tmp, "spare")  # its real files come with its worker's
        environ = self._environ(0, store, 0, placeholder, placeholder)
        try:
            if self._template is None and sys.platform.startswith("linux"):
                self._template = Template(self._bootstrap_argv(), environ)
            forked = self._template.spare(environ) if self._template is not None else None
            return forked if forked is not None else Spare(self._command(), environ)
        except OSError as exc:  # out of processes or fds: restarts start cold, as before
            self._emit(f"potluck run: no warm spare ({exc.strerror or exc}); a restart will "
                       "start a fresh interpreter")
            return None

    def _pump(self, stream: IO[bytes], sink: IO[bytes] | None, prefix: bytes,
              log: str | None) -> None:
        """Copy a worker's lines to ``sink`` (prefixed, without c10d's C++ stack traces:
        ``quiet.py``; None: not shown) and to ``log`` (every line)."""
        quieter = Quieter()
        with contextlib.ExitStack() as files:
            copy = files.enter_context(open(log, "ab")) if log else None
            for line in iter(stream.readline, b""):
                if copy is not None:
                    copy.write(line)
                    copy.flush()
                if sink is not None and quieter.shown(line.removeprefix(prefix)):
                    # torch's own excepthook prefixes a traceback's lines with the same
                    # "[rankN]: " when the script set up torch's default group: once is enough.
                    shown = line if line.startswith(prefix) else prefix + line
                    with self._lock:
                        sink.write(shown if shown.endswith(b"\n") else shown + b"\n")
                        sink.flush()
        if sink is not None and quieter.left_out:
            kept = f"its log {log} keeps them" if log else "--log-dir DIR keeps them"
            with self._lock:
                sink.write(prefix + f"(potluck run left out {quieter.left_out} lines of "
                           f"c10d warnings and C++ stack traces here; {kept})\n".encode())
                sink.flush()
        stream.close()

    def _monitor(self, workers: list[_Worker]) -> Outcome:
        while True:
            if self._signal is not None:
                return Outcome.INTERRUPTED
            running = 0
            for worker in workers:
                code = worker.proc.poll()
                if code is None:
                    running += 1
                    continue
                if worker.seen_at is None:
                    worker.seen_at = time.time()
                if not worker.ended_well(code):
                    return Outcome.FAILED
            if running == 0:
                return Outcome.SUCCEEDED
            time.sleep(_POLL)

    def _monitor_elastic(self, workers: list[_Worker], job_store: JobStore, tmp: str,
                         restarts: int) -> Outcome:
        """A dead worker is reported and restarted alone; it rejoins the running cohort
        as a new member. With no restarts left it is reported and the others go on. A
        worker that stopped below ``--min-workers`` is not restarted. The job succeeded
        if any worker saw it through. A worker of a plain torch.distributed group that
        is lost ends the attempt (``NO_COHORT``): the group cannot take a new member.
        ``restarts``: of ``--max-restarts``, those spent before."""
        restarts_left, reported = self.config.max_restarts - restarts, set()
        store = job_store.get()
        spare = self._new_spare(job_store.address(), tmp) if restarts_left > 0 else None
        sweeper = Sweeper(store, self.config.run_id, self.config.grace_period)
        learned = time.monotonic()
        try:
            while True:
                if job_store.succession is not None and time.monotonic() - learned > LEARN_S:
                    job_store.learn(store)  # (nodes that came since)
                    learned = time.monotonic()
                    if (self._status is None and not self._status_failed
                            and self.config.status_port is not None and job_store.hosting):
                        self._serve_moved_status(job_store)
                if self._signal is not None:
                    return Outcome.INTERRUPTED
                self._end_unneeded(workers, sweeper)
                running, dead = 0, []
                for index, worker in enumerate(workers):
                    code = worker.proc.poll()
                    if code is None:
                        running += 1
                    elif not (worker.stopped_below_minimum(code) or worker.proc.pid in reported
                              or worker.ended_well(code)):
                        dead.append((index, worker))
                # Workers found dead in one poll are handled in the order they failed (a
                # crash takes its peers' collectives down with it: the first is the cause).
                for index, worker in sorted(dead, key=lambda found: _failed_at(found[1])):
                    if self._plain_torch_group(store, worker):
                        return Outcome.NO_COHORT  # (the caller stops the others)
                    if restarts_left == 0 or sweeper.run_over or _quarantined(worker):
                        # (over: nothing to rejoin; quarantined: its seat is refused)
                        reported.add(worker.proc.pid)  # lost for good; the others go on
                        self._count_out(store, worker)
                        self._report_lost(worker)
                        if _quarantined(worker) and restarts_left:
                            self._emit(f"potluck run: local rank {worker.local_rank} was "
                                       "quarantined by the cohort's trust checks: not "
                                       "restarted (its seat is refused; docs/trust.md)")
                    else:
                        self._count_out(store, worker)
                        restarts_left -= 1
                        worker.seen_at = worker.seen_at or time.time()
                        self._stop([worker])
                        self._report_lost(worker)
                        restarts = self.config.max_restarts - restarts_left
                        self._emit(f"potluck run: restarting local rank {worker.local_rank} "
                                   f"as a new member ({restarts} of "
                                   f"{self.config.max_restarts} restarts): it joins the "
                                   "running cohort")
                        taken, spare = spare, None  # it becomes this worker: never discard it
                        workers[index] = self._spawn(worker.local_rank, job_store.address(),
                                                     restarts, tmp, taken)
                        spare = (self._new_spare(job_store.address(), tmp)
                                 if restarts_left > 0 else None)
                        running += 1
                if running == 0:  # (every one has ended: wait() returns its code at once)
                    if any(w.ended_well(w.proc.wait()) for w in workers):
                        return Outcome.SUCCEEDED  # done if any member saw it through
                    if any(w.stopped_below_minimum(w.proc.wait()) for w in workers):
                        return Outcome.STOPPED
                    return Outcome.FAILED
                time.sleep(_POLL)
        finally:
            sweeper.stop()
            if spare is not None:
                spare.discard()

    def _end_unneeded(self, workers: list[_Worker], sweeper: Sweeper) -> None:
        """End each running worker the cohort no longer needs (the sweeper's verdicts);
        the loop then handles it as any dead worker (restart, or report it lost). SIGKILL
        at once: a frozen process does not act on SIGTERM. Reaped by the loop's poll."""
        running = {w.proc.pid: w for w in workers if w.proc.poll() is None}
        sweeper.watch(list(running))
        for pid, why in sweeper.verdicts().items():
            worker = running.get(pid)
            if worker is not None and worker.why is None:
                worker.why = why
                _signal_group(pid, signal.SIGKILL)

    def _count_out(self, store: Store, worker: _Worker) -> None:
        """Tell the cohort at once that this worker died, so nobody waits for its
        heartbeat to go stale (which stays the fallback if the store cannot be told)."""
        with contextlib.suppress(RuntimeError):
            mark_exited(store, self.config.run_id, worker.proc.pid)

    def _serve_status(self, store_port: int) -> None:
        from potluck.status.service import StatusService

        cfg = self.config
        assert cfg.status_port is not None
        self._status = StatusService(cfg.run_id, store_port, host=cfg.status_host,
                                     port=cfg.status_port, store_host=cfg.master_addr).start()
        url = self._status.url
        self._emit(f"potluck run: status page at {url} (JSON {url}api/status, Prometheus "
                   f"{url}metrics)")

    def _serve_moved_status(self, job_store: JobStore) -> None:
        """The job's store moved to this node: the status page goes with it (on
        ``--status-port``, or a free port where that one is taken here). Its history
        before the move is in the workers' journals (``potluck plot``)."""
        from potluck.status.service import StatusService

        cfg = self.config
        assert cfg.status_port is not None
        host, port, node = job_store.address()
        failed: ConfigError | None = None
        for wanted in dict.fromkeys((cfg.status_port, 0)):
            service = StatusService(cfg.run_id, port, host=cfg.status_host, port=wanted,
                                    store_host=host)
            try:
                self._status = service.start()
                break
            except ConfigError as exc:  # (the port is taken on this machine)
                service.close()
                failed = exc
        if self._status is None:
            self._emit(f"potluck run: the job's store moved to this node, but its status "
                       f"page could not start here ({failed})")
            self._status_failed = True
            return
        url = self._status.url
        self._status.event("store", f"the job's store moved to node {node} at {host}:{port}"
                                    " (its host was lost); the page starts again here, "
                                    "the run's earlier steps are in its journals")
        self._emit(f"potluck run: the job's store moved to this node (node {node}): the "
                   f"status page is now at {url} (JSON {url}api/status)")

    def _post_exits(self, results: list[WorkerResult], then: str) -> None:
        """A fixed job's attempt failed: its failed workers' exits, on the status page."""
        for result in results:
            if result.failed or result.died_after_finishing:
                self._post_exit(result, then if result.failed else "")

    def _post_exit(self, result: WorkerResult, then: str = "") -> None:
        if self._status is None:
            return
        late = " after its script had finished" if result.died_after_finishing else ""
        why = f" ({result.why})" if result.why else ""
        self._status.event("exit", f"the worker of local rank {result.local_rank} on "
                                   f"{socket.gethostname()} (pid {result.pid}) ended: "
                                   f"{describe_exit(result.exitcode)}{late}{why}{then}")

    def _report_lost(self, worker: _Worker) -> None:
        self._post_exit(_result(worker))
        self._reported.add(worker.proc.pid)
        result = _result(worker)
        kind = result.error.exc_type if result.error is not None else ""
        title = {"StoreLostError": "a worker lost the job's store",
                 "NoQuorumError": "a worker stopped: its side of the cohort is not a "
                                  "majority"}.get(kind, "a worker was lost (elastic: the "
                                                        "cohort goes on)")
        self._emit(format_report([result], host=socket.gethostname(),
                                 node_rank=self.config.node_rank, title=title))

    def _plain_torch_group(self, store: Store, worker: _Worker) -> bool:
        """The dead worker never joined the elastic cohort, none ever formed, and the
        store holds torch's own keys: the workers formed a plain torch.distributed group
        (torch DDP), which cannot take a new member. A script with no group at all (or
        a crash before it formed one) loses nothing by a restart of that worker alone."""
        run_id = self.config.run_id
        try:
            return not joined_cohort(store, run_id, worker.proc.pid) \
                and not cohort_formed(store, run_id) and holds_torch_keys(store)
        except RuntimeError:  # the store is gone: the cohort decides nothing now
            return False

    def _stop(self, workers: list[_Worker]) -> None:
        """SIGTERM every live worker's group, SIGKILL after the grace period, reap all."""
        alive = [w for w in workers if w.proc.poll() is None]
        for worker in alive:
            worker.stopped = True
            _signal_group(worker.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.grace_period
        while any(w.proc.poll() is None for w in alive) and time.monotonic() < deadline:
            time.sleep(_POLL)
        for worker in workers:
            # Also sweeps what a worker left behind in its session (data loader processes).
            _signal_group(worker.proc.pid, signal.SIGKILL)
            worker.proc.wait()
            if worker.seen_at is None:
                worker.seen_at = time.time()
            for pump in worker.pumps:
                pump.join(timeout=5)


def _nothing(store: Store) -> None:
    """A restarted whole attempt's agent is on the roll already."""


def _log_files(config: LaunchConfig, attempt: int,
               local_rank: int) -> tuple[str | None, str | None]:
    """``--log-dir``: where a worker's stdout and stderr are also written."""
    if config.log_dir is None:
        return None, None
    folder = os.path.join(config.log_dir, config.run_id, f"attempt_{attempt}", str(local_rank))
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, "stdout.log"), os.path.join(folder, "stderr.log")


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(pgid, sig)


def _failed_at(worker: _Worker) -> tuple[float, int]:
    """When the worker failed, as far as the agent can tell: its uncaught exception's
    time (the bootstrap's error file), else now; then its rank."""
    error = read_error_file(worker.error_file)
    return (error.timestamp if error is not None else time.time(), worker.rank)


def _quarantined(worker: _Worker) -> bool:
    return not_to_restart(read_error_file(worker.error_file))


def _result(worker: _Worker) -> WorkerResult:
    return WorkerResult(
        rank=worker.rank,
        local_rank=worker.local_rank,
        pid=worker.proc.pid,
        exitcode=worker.proc.wait(),  # stopped by now: at once
        seen_at=worker.seen_at or time.time(),
        stopped=worker.stopped,
        error=read_error_file(worker.error_file),
        finished_at=read_finished_file(worker.finished_file),
        why=worker.why,
    )
