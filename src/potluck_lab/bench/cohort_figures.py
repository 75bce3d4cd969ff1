"""The figures of ``potluck bench cohort``, from what its workers wrote (pure).

A worker's ``.log`` holds JSON lines (``cohort_job``): ``member``, ``commit``, ``eval``,
``event`` (the cohort's), ``trust`` (trust's quarantines), ``attack``, ``done``. Its
``.jsonl`` is its ledger: ``[epoch, ids]`` per committed step or round.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch

Record = dict[str, Any]


@dataclass
class Worker:
    """One worker process: its node, its records, its ledger, its final parameters."""

    node: int
    records: list[Record] = field(default_factory=list)
    ledger: list[tuple[int, list[int]]] = field(default_factory=list)
    params: Path | None = None

    def of(self, kind: str) -> list[Record]:
        return [r for r in self.records if r["kind"] == kind]

    @property
    def worker_id(self) -> str | None:
        members = self.of("member")
        return str(members[0]["worker"]) if members else None


def _lines(path: Path) -> list[str]:
    """The file's whole lines: a running worker may be writing the last one, and a
    reader following the run sees it torn (an unterminated JSON string)."""
    return [line for line in path.read_text().split("\n")[:-1] if line.strip()]


def read_workers(run_dir: Path) -> list[Worker]:
    """Every worker that wrote into ``run_dir`` (``node<N>-<pid>.*``)."""
    workers = []
    for path in sorted(run_dir.glob("node*.log")):
        worker = Worker(int(path.stem.split("-")[0][4:]))
        worker.records = [json.loads(line) for line in _lines(path)]
        ledger = path.with_suffix(".jsonl")
        if ledger.exists():
            worker.ledger = [(int(e), [int(i) for i in ids]) for e, ids in
                             (json.loads(line) for line in _lines(ledger))]
        params = path.with_suffix(".pt")
        worker.params = params if params.exists() else None
        workers.append(worker)
    return workers


def committed_samples(workers: Sequence[Worker]) -> int:
    return sum(len(ids) for w in workers for _, ids in w.ledger)


def time_to_target(workers: Sequence[Worker], target: float, started: float) -> float | None:
    """Seconds from ``started`` to the first held-out loss at or under ``target``."""
    hits = [r["at"] for w in workers for r in w.of("eval") if r["loss"] <= target]
    return min(hits) - started if hits else None


def loss_curve(workers: Sequence[Worker], started: float) -> list[tuple[float, float]]:
    """(seconds since ``started``, held-out loss), in time order."""
    return sorted((r["at"] - started, r["loss"]) for w in workers for r in w.of("eval"))


def trained(workers: Sequence[Worker]) -> list[tuple[int, list[int]]]:
    """Every worker's ledger (its commits the run's lineage holds, ``_adopted``), and the
    part a worker was killed (or quarantined) with
    after it sent it: its last step or round, which the others committed with nothing
    lost (a member lost mid-round makes the commit name the positions it held, handed
    out again; a member lost mid-step makes the others fail the step and redo it)."""
    finishers = [w for w in workers if w.params is not None]
    records = [record for w in workers
               for record, commit in zip(w.ledger, [*w.of("commit"), *[None] * len(w.ledger)],
                                         strict=False)
               if commit is None or _adopted(commit, finishers)]
    for w in workers:
        parts = [] if w.of("done") else _open_part(w)
        if not parts:
            continue
        if not all(_adopted(c, finishers) for c in w.of("commit")):
            continue  # (it left the lineage: its later rounds are not the cohort's)
        at = parts[0]["round"]
        others = [o for o in workers if o is not w]
        commits = [r for o in others for r in o.of("commit") if r["steps"] == at]
        redone = any(r["round"] == at for o in others for r in o.of("failed"))
        if commits and not redone and not any(r.get("lost") for r in commits):
            records.append((parts[0]["epoch"],
                            [i for r in parts if r["round"] == at for i in r["ids"]]))
    return records


def _adopted(commit: Record, finishers: Sequence[Worker]) -> bool:
    """Whether the run's lineage (its finishers') holds a worker's commit: not where the
    finishers redid that round with another number of members, handing positions out
    again. (A member whose round's sync completed while another's failed, and that was
    then left out of the next generation, logged a commit the cohort redid without it:
    its part's positions were handed out again and trained by the others.) A finisher
    that took the round from that member instead (the survivors realign to the furthest
    step) logs it as a commit with the new number of members that lost nothing: the
    lineage holds the member's commit."""
    redone = {int(c["workers"]) for f in finishers for c in f.of("commit")
              if c["steps"] == commit["steps"] and c.get("lost")}
    return not redone or int(commit["workers"]) in redone


def _open_part(worker: Worker) -> list[Record]:
    """The local steps a worker began after its last commit or failed step (logged
    before each step: it may die inside one)."""
    part: list[Record] = []
    for record in worker.records:
        if record["kind"] in ("commit", "failed"):
            part = []
        elif record["kind"] == "pending":
            part.append(record)
    return part


def whole_epochs(workers: Sequence[Worker]) -> int:
    """The epochs a halted run trained whole: those before the epoch its workers halted
    in (the epoch of the batch each had in hand); where none logged its halt, those
    before the newest epoch it committed samples in."""
    halts = [int(r["epoch"]) for w in workers for r in w.of("halt")]
    if halts:
        return min(halts)
    return max((epoch for epoch, _ in trained(workers)), default=0)


def exactly_once(workers: Sequence[Worker], samples: int, epochs: int) -> dict[str, int]:
    """Samples committed twice and never committed, over the run's epochs."""
    counts: Counter[tuple[int, int]] = Counter(
        (epoch, i) for epoch, ids in trained(workers) for i in ids)
    twice = sum(c - 1 for c in counts.values() if c > 1)
    missing = sum(1 for e in range(epochs) for i in range(samples) if (e, i) not in counts)
    return {"twice": twice, "missing": missing}


def replicas_equal(states: Iterable[dict[str, torch.Tensor]]) -> bool | None:
    """Whether every finisher's parameters are bitwise equal (None: no finisher)."""
    states = list(states)
    if not states:
        return None
    first = states[0]
    return all(state.keys() == first.keys() and all(torch.equal(state[k], first[k])
                                                   for k in first) for state in states[1:])


def quarantine(workers: Sequence[Worker], attacker_node: int,
               metrics: Path | None = None) -> dict[str, Any] | None:
    """The attacker's quarantine: the round it was out after, the first round it
    corrupted, the rounds between (its first corrupted round counted as 1), the
    evidence; None if it never attacked. Never quarantined: ``round`` None, and
    ``strikes``, what trust struck it for (the ranks' metrics under ``metrics``)."""
    attacks = sorted(r["round"] for w in workers if w.node == attacker_node
                     for r in w.of("attack"))
    ids = {w.worker_id for w in workers if w.node == attacker_node}
    if not attacks:
        return None
    found = [r for w in workers for r in w.of("trust")
             if r.get("event") == "quarantine" and r.get("member") in ids]
    if not found:
        return {"first_attack": attacks[0], "round": None, "rounds": None, "evidence": None,
                "strikes": [] if metrics is None else strikes(metrics, ids)}
    out = min(found, key=lambda r: r["step"])
    return {"first_attack": attacks[0], "round": out["step"],
            "rounds": out["step"] - attacks[0] + 1,
            "evidence": [e.get("kind") for e in out.get("evidence", [])]}


def strikes(metrics: Path, members: set[str | None]) -> list[str]:
    """The strikes against ``members`` in the ranks' metrics (``ranks/*.jsonl``), each
    once, by round: "round R: why" (a copied pair's note, "no strike until ...", is
    not one)."""
    seen: dict[tuple[int, str], None] = {}
    for path in sorted(metrics.glob("ranks/*.jsonl")):
        for line in _lines(path):
            record = json.loads(line)
            text = str(record.get("text", ""))
            if (record.get("kind") == "event" and record.get("what") == "strike"
                    and record.get("member") in members and "no strike" not in text):
                seen[(int(record.get("step", 0)), text)] = None
    return [f"round {step}: {text}" for step, text in sorted(seen)]


def honest_quarantines(workers: Sequence[Worker], attacker_node: int | None) -> list[str]:
    """Members other than the attacker's that trust quarantined."""
    bad = {w.worker_id for w in workers if w.node == attacker_node}
    return sorted({str(r["member"]) for w in workers for r in w.of("trust")
                   if r.get("event") == "quarantine" and r.get("member") not in bad})


def group_starts(workers: Sequence[Worker]) -> list[tuple[float, int]]:
    """Each start of a torch DDP group (its rank 0's ``start``): (wall clock, the step it
    resumed from), in time order."""
    return sorted((r["at"], int(r["resumed"])) for w in workers for r in w.of("start")
                  if r["rank"] == 0)


def steps_redone(workers: Sequence[Worker]) -> list[tuple[float, int]]:
    """Each restart of a torch DDP group: (when, the steps the group before it had
    committed past the checkpoint this one resumed from: to be trained again)."""
    commits = [(r["at"], int(r["steps"])) for w in workers for r in w.of("commit")]
    starts = group_starts(workers)
    out = []
    for (before, was), (at, resumed) in pairwise(starts):
        reached = max((step for t, step in commits if before <= t < at), default=was)
        out.append((at, max(0, reached - resumed)))
    return out


def redone_at_faults(redone: Sequence[tuple[float, int]],
                     fired_at: Sequence[float]) -> list[int]:
    """The steps redone after each fault (by the restarts from its wall clock to the
    next fault's); restarts before the first fault count nowhere."""
    bounds = [*fired_at, float("inf")]
    return [sum(steps for at, steps in redone if bounds[i] <= at < bounds[i + 1])
            for i in range(len(fired_at))]
