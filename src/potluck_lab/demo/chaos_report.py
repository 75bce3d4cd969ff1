"""What the chaos demo shows, as pure functions of the records its processes wrote.

The workers (``potluck_lab.demo.elastic_worker``) and the chaos driver append JSON records
to files in the run dir; ``parse_run`` turns them, in any order, into a ``ChaosRun``:
who each process was, where the victim stopped for the kill, the kill, the membership
events (one per generation, however many members recorded it), the committed and the
redone steps, and whether the survivors had to wait for the rejoin. The ``format_*``
functions and tables turn that into the lines the demo prints. Nothing here reads a
file, a clock or a process.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from potluck_lab.demo.report import format_table


@dataclass(frozen=True)
class Incarnation:
    """One process of one worker: a restarted worker is a new incarnation (new pid)."""

    launch_rank: int
    restart: int
    pid: int

    @property
    def label(self) -> str:
        restarted = f", restart {self.restart}" if self.restart else ""
        return f"worker {self.launch_rank} (pid {self.pid}{restarted})"


@dataclass(frozen=True)
class Kill:
    """The chaos driver's SIGKILL: whom, and how far the run had got."""

    launch_rank: int
    pid: int
    after_step: int  # the last step committed (0-based): the victim stopped after it
    time: float


@dataclass(frozen=True)
class RejoinWait:
    """The survivors waited for the restarted worker to ask to join, so that the run
    shows the rejoin however slowly the new process starts."""

    steps: int  # steps committed when they began to wait
    waited_s: float
    asked: bool  # False: it did not ask within the timeout; the run went on without it
    workers: int


@dataclass(frozen=True)
class MembershipEvent:
    """One generation change as the cohort recorded it; ``recovery_s`` is the slowest
    member's time from noticing to a working group (every member measures its own)."""

    generation: int
    cause: str
    left: tuple[str, ...]
    joined: tuple[str, ...]
    world_size: int
    recovery_s: float
    time: float


@dataclass
class ChaosRun:
    """Everything the run dir says about one chaos demo run."""

    incarnations: dict[int, Incarnation] = field(default_factory=dict)  # by pid
    members: dict[int, str] = field(default_factory=dict)  # pid -> worker id
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)  # committed, by index
    redone: list[int] = field(default_factory=list)  # steps abandoned and trained again
    events: list[MembershipEvent] = field(default_factory=list)  # by generation
    joins: dict[int, int] = field(default_factory=dict)  # pid -> step it joined at
    held: dict[int, int] = field(default_factory=dict)  # victim pid -> steps committed
    kill: Kill | None = None
    rejoin_wait: RejoinWait | None = None
    done: list[dict[str, Any]] = field(default_factory=list)

    @property
    def final_steps(self) -> int:
        """Committed steps at the end (the most any member saw; 0 if none finished)."""
        return max((int(d["steps"]) for d in self.done if not d.get("left")), default=0)

    @property
    def sample(self) -> str | None:
        return next((d["sample"] for d in self.done if d.get("sample")), None)

    @property
    def n_params(self) -> int:
        return max((int(d.get("n_params", 0)) for d in self.done), default=0)

    def label(self, worker_id: str) -> str:
        """``worker 1 (pid 4242, restart 1)`` for a worker id ``host:pid:nonce``."""
        pid = _pid_of(worker_id)
        incarnation = self.incarnations.get(pid) if pid is not None else None
        return incarnation.label if incarnation is not None else worker_id

    def pending_joiners(self) -> list[Incarnation]:
        """Processes that said hello but were never admitted into the cohort."""
        return [inc for pid, inc in self.incarnations.items() if pid not in self.members]


def parse_run(records: Iterable[Mapping[str, Any]]) -> ChaosRun:
    """A ``ChaosRun`` from every record of the run dir; unknown kinds are ignored."""
    run = ChaosRun()
    events: dict[int, MembershipEvent] = {}
    redone: set[int] = set()
    for record in records:
        kind, pid = record.get("kind"), int(record.get("pid", -1))
        if kind == "hello":
            run.incarnations[pid] = Incarnation(int(record["launch_rank"]),
                                                int(record["restart"]), pid)
        elif kind == "member":
            run.members[pid] = str(record["worker_id"])
        elif kind == "joined":
            run.joins[pid] = int(record["step"])
        elif kind == "step":
            run.steps[int(record["step"])] = dict(record)
        elif kind == "redo":
            redone.add(int(record["step"]))
        elif kind == "event":
            event = _event(record)
            seen = events.get(event.generation)
            if seen is None or event.recovery_s > seen.recovery_s:
                events[event.generation] = event
        elif kind == "held":
            run.held[pid] = int(record["step"])
        elif kind == "waited":
            run.rejoin_wait = RejoinWait(int(record["step"]), float(record["waited_s"]),
                                         bool(record["asked"]), int(record["workers"]))
        elif kind == "kill":
            run.kill = Kill(int(record["launch_rank"]), int(record["target"]),
                            int(record["after_step"]), float(record["time"]))
        elif kind == "done":
            run.done.append(dict(record))
    run.events = [events[g] for g in sorted(events)]
    run.redone = sorted(redone)
    return run


def _event(record: Mapping[str, Any]) -> MembershipEvent:
    return MembershipEvent(
        generation=int(record["generation"]), cause=str(record["cause"]),
        left=tuple(record.get("left", ())), joined=tuple(record.get("joined", ())),
        world_size=int(record["world_size"]), recovery_s=float(record["recovery_s"]),
        time=float(record["time"]),
    )


def _pid_of(worker_id: str) -> int | None:
    parts = worker_id.split(":")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None


# ------------------------------------------------------------------ live lines


def format_step(record: Mapping[str, Any], total: int) -> str:
    workers = int(record["workers"])
    return (f"step {int(record['step']) + 1:>{len(str(total))}}/{total}  loss "
            f"{float(record['loss']):.3f}  {_workers(workers)} (generation "
            f"{record['generation']})  {float(record['step_s']) * 1e3:.0f} ms/step")


def format_kill(kill: Kill, label: str) -> str:
    return (f"chaos: SIGKILL to {label} once step {kill.after_step + 1} had committed; "
            "no warning, no goodbye")


def format_wait(wait: RejoinWait, label: str) -> str:
    """The survivors held the run for the restarted worker (the demo must show the rejoin)."""
    if wait.asked:
        return (f"chaos: step {wait.steps} had committed and {label} was not back yet: the "
                f"{_workers(wait.workers)} left waited {wait.waited_s:.1f} s for it to ask to "
                "join, so that the run shows the rejoin")
    return (f"chaos: step {wait.steps} had committed and {label} was not back yet: the "
            f"{_workers(wait.workers)} left waited {wait.waited_s:.1f} s, but it did not ask "
            "to join; the run goes on without it")


def format_event(event: MembershipEvent, run: ChaosRun) -> str:
    """One membership change: generation, cause, who left or joined, size, recovery."""
    parts = [f"generation {event.generation}: {describe_cause(event)}"]
    if event.left:
        parts.append("left: " + ", ".join(run.label(w) for w in event.left))
    if event.joined:
        parts.append("joined: " + ", ".join(run.label(w) for w in event.joined))
    parts.append(f"now {_workers(event.world_size)}")
    parts.append(f"recovery {event.recovery_s:.2f} s")
    since = _since_kill(event, run.kill)
    if since is not None:
        parts.append(f"{since:.1f} s after the kill")
    return "; ".join(parts)


def describe_cause(event: MembershipEvent) -> str:
    """The cohort's cause, said for a reader (a boundary admits or lets go)."""
    if event.cause != "boundary":
        return event.cause
    if event.joined and not event.left:
        return "admitted at a step boundary with the live state"
    if event.left and not event.joined:
        return "a graceful leave at a step boundary"
    return "membership changed at a step boundary"


def format_redo(step: int, workers: int) -> str:
    return (f"step {step + 1} was in flight: not applied, redone on the same samples by "
            f"the {_workers(workers)} left (nothing skipped, nothing trained twice)")


def format_join(incarnation: Incarnation, step: int) -> str:
    return (f"{incarnation.label} is back: restarted by the launcher, received the live "
            f"state (model, optimizer, data cursor) and trains from step {step + 1}")


def _since_kill(event: MembershipEvent, kill: Kill | None) -> float | None:
    if kill is None or event.time < kill.time:
        return None
    return event.time - kill.time


def _workers(n: int) -> str:
    return "1 worker" if n == 1 else f"{n} workers"


# ------------------------------------------------------------------ the closing report


def events_table(run: ChaosRun) -> str:
    """Every membership change of the run, one row per generation."""
    if not run.events:
        return "membership events: none (the cohort never changed)"
    rows = []
    for event in run.events:
        since = _since_kill(event, run.kill)
        rows.append([
            str(event.generation), describe_cause(event),
            ", ".join(run.label(w) for w in event.left) or "-",
            ", ".join(run.label(w) for w in event.joined) or "-",
            str(event.world_size), f"{event.recovery_s:.2f} s",
            "-" if since is None else f"{since:.1f} s",
        ])
    header = ["gen", "cause", "left", "joined", "workers", "recovery", "after kill"]
    return "membership events:\n" + format_table(header, rows)


def steps_line(run: ChaosRun, requested: int) -> str:
    """Committed steps against the request, and steps lost (0 when all went well)."""
    final = run.final_steps
    missing = [s for s in range(final) if s not in run.steps]
    lost = requested - final
    line = f"steps: {final} of {requested} committed; steps lost: {lost}"
    if run.redone:
        redone = ", ".join(str(s + 1) for s in run.redone)
        noun = "step" if len(run.redone) == 1 else "steps"
        line += (f" ({noun} {redone} was in flight at the kill: abandoned, then redone by "
                 "the survivors on the same global batch)")
    if missing:
        line += f"; no record of step(s) {', '.join(str(s + 1) for s in missing[:5])}"
    return line


def loss_milestones(run: ChaosRun, window: int = 20) -> str:
    """Mean loss over ``window`` steps at the start, before the kill, after the
    rejoin and at the end: the run carried on learning through the chaos."""
    steps = sorted(run.steps)
    if not steps:
        return "loss: no steps were recorded"
    points: list[tuple[str, list[int]]] = [("start", steps[:window])]
    if run.kill is not None:
        before = [s for s in steps if s <= run.kill.after_step][-window:]
        points.append(("before the kill", before))
    rejoined = min(run.joins.values(), default=None)
    if rejoined is not None:
        points.append(("after the rejoin", [s for s in steps if s >= rejoined][:window]))
    points.append(("end", steps[-window:]))
    parts = []
    for name, chosen in points:
        if chosen:
            mean = statistics.fmean(float(run.steps[s]["loss"]) for s in chosen)
            parts.append(f"{mean:.3f} {name} (steps {chosen[0] + 1}-{chosen[-1] + 1})")
    return (f"loss, mean of {window} steps of rank 0's share: " + " -> ".join(parts))


def throughput_rows(
    run: ChaosRun, global_batch: int, tokens_per_sample: int, warmup: int
) -> list[list[str]]:
    """Median step time and throughput for each cohort size the run trained with.

    The first ``warmup`` steps and each generation's first step (a rebuilt group, a
    rejoiner's first step) are left out; redone steps too (they include recovery)."""
    by_size: dict[int, list[float]] = {}
    previous_generation = None
    for step in sorted(run.steps):
        record = run.steps[step]
        generation = record["generation"]
        fresh = generation != previous_generation
        previous_generation = generation
        if step < warmup or fresh or step in run.redone:
            continue
        by_size.setdefault(int(record["workers"]), []).append(float(record["step_s"]))
    rows = []
    for size, times in by_size.items():
        step_s = statistics.median(times)
        rate = global_batch / step_s
        rows.append([f"throughput, {_workers(size)}",
                     f"{rate:,.1f} samples/s, {rate * tokens_per_sample:,.0f} tokens/s",
                     f"global batch / median step time ({step_s * 1e3:.1f} ms over "
                     f"{len(times)} step{'s' if len(times) > 1 else ''})"])
    return rows


def figures(rows: Sequence[Sequence[str]]) -> str:
    if not rows:
        return "throughput: not enough steps to measure"
    return format_table(["figure", "value", "how it was measured"], rows)
