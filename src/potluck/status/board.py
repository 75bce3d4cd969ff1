"""``StatusBoard``: the launcher's picture of the cohort, from the workers' pulses.

Each worker pulses onto the store (``metrics.publisher``): where it is, its new steps,
its membership events. ``StorePoller`` reads every pulse a few times a second and hands
them to ``StatusBoard.ingest``; ``snapshot()`` is the ``/api/status`` document
(``docs/status.md``). The members shown are the workers of the newest attempt (a fixed
job's restart by the launcher starts all of them again) and generation still pulsing; a
worker of an older one, or one that said it is done, drops out (its loss is an event).
Notes (``potluck.events``: checkpoints, rebalances, trust's strikes and quarantines) come
with the pulses; every member may send the same one, and it is shown once. Each
complete step (every member reported it) is judged once, in order, by
``attribution.slowest_compute``, so the history of "who was the bottleneck" does not
depend on how often anybody polls; silence is judged at snapshot time.
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch._C._distributed_c10d import Store

from potluck import keys
from potluck.status.attribution import AttributionRule, RankWindow, slowest, slowest_compute

log = logging.getLogger(__name__)

KEEP_STEPS = 600  # per worker, and points of each curve
KEEP_EVENTS = 200
KEEP_NOTES_SEEN = 2000  # notes recognized as already shown


@dataclass
class _Worker:
    pulse: dict[str, Any]
    seen_at: float
    steps: OrderedDict[int, dict[str, Any]] = field(default_factory=OrderedDict)

    @property
    def generation(self) -> int:
        return int(self.pulse.get("generation", 0))

    @property
    def attempt(self) -> int:
        return int(self.pulse.get("attempt", 0))

    @property
    def last_step(self) -> int:
        return next(reversed(self.steps)) if self.steps else -1


class StatusBoard:
    """Folds pulses into the cohort's status (thread-safe: a poller writes, HTTP reads)."""

    def __init__(self, run_id: str, *, rule: AttributionRule | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.run_id, self.rule = run_id, rule or AttributionRule()
        self._clock, self._wall = clock, wall
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}
        self._judged = -1  # the last step judged for the bottleneck history
        self._history: list[dict[str, Any]] = []
        self._events: deque[dict[str, Any]] = deque(maxlen=KEEP_EVENTS)
        self._generations_seen: set[tuple[int, int]] = set()  # (attempt, generation)
        self._curve: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._attempt = 0  # the newest attempt heard from
        self._restarted = False  # its first judged step drops the last attempt's later ones
        self._notes_seen: OrderedDict[tuple[Any, ...], None] = OrderedDict()
        self._standing: dict[str, str] = {}  # member -> trust's last word on it

    # ------------------------------------------------------------------- input

    def ingest(self, pulses: Mapping[str, dict[str, Any]]) -> None:
        """The latest pulse of each worker (unchanged ones are recognized by ``seq``)."""
        now = self._clock()
        with self._lock:
            for worker, pulse in pulses.items():
                known = self._workers.get(worker)
                if known is not None and known.pulse.get("seq") == pulse.get("seq"):
                    continue
                if known is None:
                    known = self._workers[worker] = _Worker(pulse, now)
                known.pulse, known.seen_at = pulse, now
                for record in pulse.get("steps", []):
                    known.steps[int(record["step"])] = record
                    known.steps.move_to_end(int(record["step"]))
                while len(known.steps) > KEEP_STEPS:
                    known.steps.popitem(last=False)
                self._take_attempt(known.attempt)
                self._take_events(pulse, known.attempt)
                self._take_notes(pulse, known.attempt)
            self._judge()

    def add_event(self, what: str, text: str) -> None:
        """An event the launcher saw itself (a worker process exited); its step is None
        before any worker's first (a page that starts where the store moved)."""
        with self._lock:
            step = self._step()
            self._events.append({"time": self._wall(), "step": step if step >= 0 else None,
                                 "what": what, "text": text})

    # ------------------------------------------------------------------ output

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            now = self._clock()
            members = self._members()
            rows = [self._row(w, now) for w in members]
            windows = [RankWindow(int(w.pulse["rank"]), self._computes(w),
                                  now - w.seen_at, str(w.pulse.get("phase", "")))
                       for w in members if not w.pulse.get("done")]
            verdict = slowest(windows, self.rule)
            since = self._history[-1]["step"] if self._history else None
            curve = sorted(self._curve.items())  # a restarted job redoes its steps
            return {
                "run_id": self.run_id, "time": self._wall(), "step": self._step(),
                "generation": max((w.generation for w in members), default=0),
                "world_size": len(members),
                "ranks": rows,
                "slowest": None if verdict is None else {
                    "rank": verdict.rank, "reason": verdict.reason,
                    "since_step": None if verdict.silent else since, "silent": verdict.silent},
                "slowest_history": list(self._history),
                "events": list(self._events),
                "curves": {"step": [s for s, _ in curve],
                           "loss": [p.get("loss") for _, p in curve],
                           "samples_per_s": [p.get("samples_per_s") for _, p in curve]},
                "efficiency": self._efficiency(members),
                "notices": notices([w.pulse for w in members]),
            }

    # --------------------------------------------------------------- internals

    def _generation(self) -> list[_Worker]:
        """The newest attempt's newest generation, workers that said they are done
        included: once it ends, no older generation's worker (one that died or was
        quarantined, and never said it was done) stands for the cohort again."""
        this = [w for w in self._workers.values() if w.attempt == self._attempt]
        if not this:
            return []
        newest = max(w.generation for w in this)
        return sorted((w for w in this if w.generation == newest),
                      key=lambda w: int(w.pulse.get("rank", 0)))

    def _members(self) -> list[_Worker]:
        """The newest generation's workers that have not said they are done (a worker
        of an attempt the launcher gave up on never says so)."""
        return [w for w in self._generation() if not w.pulse.get("done")]

    def _computes(self, worker: _Worker) -> list[float]:
        tail = list(worker.steps.values())[-self.rule.window:]
        return [float(r["compute_s"]) for r in tail if r.get("compute_s") is not None]

    def _step(self) -> int:
        return max((w.last_step for w in self._workers.values()
                    if w.attempt == self._attempt), default=-1)

    def _judge(self) -> None:
        """Judge each step every member has reported, in order, once (the last steps
        too, which come with the pulses that say the workers are done)."""
        members = self._generation()
        # Until every member of the generation has pulsed, a step is not complete: the
        # ones heard from first would be judged (and plotted) alone.
        if not members or len(members) < max(int(w.pulse.get("world_size", 1))
                                              for w in members):
            return
        upto = min(w.last_step for w in members)
        for step in range(max(self._judged + 1, upto - KEEP_STEPS + 1), upto + 1):
            if not all(step in w.steps for w in members):
                continue  # never heard from everyone (before a restarted attempt resumed)
            if self._restarted:  # the last attempt's steps from here on are void
                self._restarted = False
                for old in [s for s in self._curve if s >= step]:
                    del self._curve[old]
                self._history = [h for h in self._history if h["step"] < step]
            windows = []
            for w in members:
                computes = [float(w.steps[s]["compute_s"])
                            for s in range(step - self.rule.window + 1, step + 1)
                            if s in w.steps and w.steps[s].get("compute_s") is not None]
                windows.append(RankWindow(int(w.pulse["rank"]), computes))
            verdict = slowest_compute(windows, self.rule)
            rank = None if verdict is None else verdict.rank
            if (self._history[-1]["rank"] if self._history else None) != rank:
                self._history.append({"step": step, "rank": rank,
                                      "reason": None if verdict is None else verdict.reason})
            self._curve[step] = self._point(members, step)
            while len(self._curve) > KEEP_STEPS:
                self._curve.popitem(last=False)
        self._judged = max(self._judged, upto)

    @staticmethod
    def _point(members: list[_Worker], step: int) -> dict[str, Any]:
        records = [w.steps[step] for w in members if step in w.steps]
        samples = [r.get("samples") for r in records]
        longest = max((r.get("step_s") or 0.0 for r in records), default=0.0)
        point: dict[str, Any] = {}
        if records and None not in samples and longest > 0:
            point["samples_per_s"] = sum(int(n) for n in samples if n is not None) / longest
        losses = [r["loss"] for r in records if r.get("loss") is not None]
        if losses:
            point["loss"] = losses[0]
        return point

    def _efficiency(self, members: list[_Worker]) -> float | None:
        """The ranks' mean compute time over the longest step time, per complete step;
        the median of the last few, at most 1. 1: every rank computed all step long; the
        rest went to waiting for slower ranks and to communication (the page says so)."""
        steps = list(self._curve)[-self.rule.window * 3:]
        ratios = []
        for step in steps:
            records = [w.steps[step] for w in members if step in w.steps]
            if len(records) != len(members) or not records:
                continue
            longest = max(r.get("step_s") or 0.0 for r in records)
            computes = [r.get("compute_s") or 0.0 for r in records]
            if longest > 0 and all(computes):
                ratios.append(statistics.mean(computes) / longest)
        return min(1.0, statistics.median(ratios)) if ratios else None

    def _row(self, worker: _Worker, now: float) -> dict[str, Any]:
        pulse = worker.pulse
        record = next(reversed(worker.steps.values()), {}) if worker.steps else {}
        silent = now - worker.seen_at

        def ms(name: str) -> float | None:
            value = record.get(name)
            return None if value is None else float(value) * 1e3

        return {"rank": pulse.get("rank"), "worker": pulse.get("worker"),
                "host": str(pulse.get("worker", "")).rsplit(":", 1)[0],
                "generation": worker.generation, "step": worker.last_step,
                "phase": pulse.get("phase"), "phase_s": pulse.get("phase_s"),
                "last_seen_s": silent, "stale": silent > self.rule.silent_after_s,
                "compute_ms": ms("compute_s"), "wait_ms": ms("wait_s"),
                "comm_ms": ms("comm_s"), "step_ms": ms("step_s"),
                "bytes": record.get("bytes"), "samples": record.get("samples"),
                "share": record.get("share"), "samples_per_s": record.get("samples_per_s"),
                "trust": self._standing.get(str(pulse.get("member")))}

    def _take_attempt(self, attempt: int) -> None:
        """A fixed job's workers started again (``--max-restarts``): the old ones are
        gone, and the steps are counted (and judged) from where the new ones begin."""
        if attempt <= self._attempt:
            return
        self._attempt, self._judged, self._restarted = attempt, -1, True
        self._standing.clear()  # a fixed job's member ids ("rank1") name new workers now
        self._events.append({"time": self._wall(), "step": None, "what": "restart",
                             "text": f"attempt {attempt}: the launcher started every worker "
                                     "again"})

    def _take_events(self, pulse: dict[str, Any], attempt: int) -> None:
        for event in pulse.get("events", []):
            generation = int(event.get("generation", -1))
            if (attempt, generation) in self._generations_seen:
                continue
            self._generations_seen.add((attempt, generation))
            # The step the new generation began at: its first step in this pulse.
            steps = [int(r["step"]) for r in pulse.get("steps", [])
                     if int(r.get("generation", -1)) >= generation]
            self._events.append({"time": self._wall(),
                                 "step": min(steps) if steps else self._step(),
                                 "what": _what(event), "text": _text(event)})

    def _take_notes(self, pulse: dict[str, Any], attempt: int) -> None:
        """Each note once, however many members sent it; trust notes of the newest
        attempt set the member's standing in the table."""
        for note in pulse.get("notes", []):
            key = (attempt, note.get("what"), note.get("step"), note.get("member"),
                   note.get("text"))
            if key in self._notes_seen:
                continue
            self._notes_seen[key] = None
            while len(self._notes_seen) > KEEP_NOTES_SEEN:
                self._notes_seen.popitem(last=False)
            step = note.get("step")
            self._events.append({"time": float(note.get("time") or self._wall()),
                                 "step": self._step() if step is None else int(step),
                                 "what": str(note.get("what")), "text": str(note.get("text"))})
            member = note.get("member")
            if member is not None and attempt == self._attempt:
                self._standing[str(member)] = _standing(note)


def notices(pulses: list[dict[str, Any]]) -> list[str]:
    """What the page cannot show for these members, and why, in words."""
    blind = sorted(int(p.get("rank", 0)) for p in pulses if p.get("counts_samples") is False)
    if not blind:
        return []
    who = (f"rank {blind[0]} trains" if len(blind) == 1
           else f"ranks {', '.join(map(str, blind))} train")
    return [f"{who} a potluck.DataParallel without potluck.prepare: its steps are timed, "
            "but the samples of a step are not known, so samples/s, shares and the "
            "throughput curve stay blank and no loss is reported; potluck.prepare(model, "
            "optimizer, dataset, global_batch=...) shows them"]


def _standing(note: Mapping[str, Any]) -> str:
    """The table's trust cell after a trust note: ``quarantined (step 12)``."""
    what = str(note.get("what"))
    label = {"strike": "struck", "repair": "repaired", "quarantine": "quarantined",
             "swap": "swapped out"}.get(
        what, what)
    step = note.get("step")
    return label if step is None else f"{label} (step {step})"


def _what(event: Mapping[str, Any]) -> str:
    if event.get("left") and event.get("cause") != "boundary":
        return "loss"
    return "join" if event.get("joined") and not event.get("left") else "leave"


def _text(event: Mapping[str, Any]) -> str:
    parts = []
    if event.get("left"):
        parts.append(f"{', '.join(event['left'])} left")
    if event.get("joined"):
        parts.append(f"{', '.join(event['joined'])} joined")
    return (f"generation {event.get('generation')}: {'; '.join(parts) or 'regrouped'} "
            f"({event.get('cause')}); {event.get('world_size')} workers, recovered in "
            f"{float(event.get('recovery_s') or 0.0):.2f} s")


class StorePoller:
    """Reads every worker's pulse from the job's store into a board, from a thread."""

    def __init__(self, connect: Callable[[], Store], board: StatusBoard, run_id: str,
                 interval: float = 0.2) -> None:
        self._connect, self._board, self._run_id = connect, board, run_id
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="potluck-status-poll",
                                        daemon=True)
        self._workers: list[str] = []

    def start(self) -> StorePoller:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def poll(self, store: Store) -> dict[str, dict[str, Any]]:
        count_key = keys.status_count(self._run_id)
        count = int(store.add(count_key, 0))
        for slot in range(len(self._workers), count):
            key = keys.status_slot(self._run_id, slot)
            if not store.check([key]):  # counted, its name not written yet: next poll
                break
            self._workers.append(store.get(key).decode())
        pulses = {}
        for worker in self._workers:
            key = keys.status_pulse(self._run_id, worker)
            if store.check([key]):
                pulses[worker] = json.loads(store.get(key))
        return pulses

    def _run(self) -> None:
        try:
            store = self._connect()
        except Exception as exc:
            log.warning("the status page cannot read the store: %s", exc)
            return
        while not self._stop.wait(self._interval):
            try:
                self._board.ingest(self.poll(store))
            except Exception as exc:  # the store closed at the run's end
                log.debug("status poll failed: %s", exc)
                if self._stop.is_set():
                    return
