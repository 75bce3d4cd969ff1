"""``StatusBoard`` folds hand-made pulses into /api/status; ``StorePoller`` reads a store."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from potluck import keys
from potluck.status.attribution import AttributionRule
from potluck.status.board import StatusBoard, StorePoller

RUN = "run-1"
WALL = 1_764_000_000.0


class Clocks:
    """A fake monotonic clock and wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 500.0
        self.wall_now = WALL

    def clock(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.wall_now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall_now += seconds


def board_of(clocks: Clocks, rule: AttributionRule | None = None) -> StatusBoard:
    return StatusBoard(RUN, rule=rule, clock=clocks.clock, wall=clocks.wall)


def rec(step: int, compute: float = 0.1, *, step_s: float = 0.2, samples: int | None = 16,
        **over: Any) -> dict[str, Any]:
    """A ``rank_step`` record as a publisher carries it."""
    record: dict[str, Any] = {"step": step, "compute_s": compute, "wait_s": 0.05,
                              "comm_s": 0.08, "step_s": step_s, "bytes": 4096,
                              "samples": samples, "share": 0.5}
    if samples is not None and compute:
        record["samples_per_s"] = samples / compute
    record.update(over)
    return {k: v for k, v in record.items() if v is not None}


class Worker:
    """Makes one worker's successive pulses (``seq`` counts up)."""

    def __init__(self, name: str, rank: int, generation: int = 0, world_size: int = 2, *,
                 attempt: int = 0) -> None:
        self.name, self.rank = name, rank
        self.generation, self.world_size, self.attempt = generation, world_size, attempt
        self.seq = 0

    def pulse(self, steps: Iterable[dict[str, Any]] = (), *, phase: str = "computing step 0",
              done: bool = False, events: Sequence[dict[str, Any]] = (),
              notes: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
        self.seq += 1
        return {"seq": self.seq, "worker": self.name, "pid": 1, "member": f"m-{self.name}",
                "attempt": self.attempt, "rank": self.rank,
                "world_size": self.world_size, "generation": self.generation,
                "phase": phase, "phase_s": 0.01, "steps": list(steps),
                "events": list(events), "notes": list(notes), "done": done}


def ranks_of(snapshot: dict[str, Any]) -> list[tuple[int, str]]:
    return [(row["rank"], row["worker"]) for row in snapshot["ranks"]]


# ------------------------------------------------------------------------------ rows


@pytest.mark.timeout(10)
def test_rows_per_member_sorted_by_rank_with_ms_figures() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    b, a = Worker("hostB:2", 1), Worker("hostA:1", 0)
    # rank 1 arrives first; rows still come in rank order
    board.ingest({b.name: b.pulse([rec(0, 0.25, step_s=0.3, samples=8, share=0.25)],
                                  phase="in the gradient all-reduce of step 1")})
    board.ingest({a.name: a.pulse([rec(0, 0.1, step_s=0.3, samples=24, share=0.75)])})
    clocks.advance(0.5)
    snap = board.snapshot()

    assert (snap["run_id"], snap["time"], snap["step"]) == (RUN, WALL + 0.5, 0)
    assert (snap["generation"], snap["world_size"]) == (0, 2)
    assert ranks_of(snap) == [(0, "hostA:1"), (1, "hostB:2")]
    first, second = snap["ranks"]
    assert first["host"] == "hostA" and second["host"] == "hostB"
    assert second == {
        "rank": 1, "worker": "hostB:2", "host": "hostB", "generation": 0, "step": 0,
        "phase": "in the gradient all-reduce of step 1", "phase_s": 0.01,
        "last_seen_s": pytest.approx(0.5), "stale": False,
        "compute_ms": pytest.approx(250.0), "wait_ms": pytest.approx(50.0),
        "comm_ms": pytest.approx(80.0), "step_ms": pytest.approx(300.0),
        "bytes": 4096, "samples": 8, "share": 0.25, "samples_per_s": pytest.approx(32.0),
        "trust": None}
    assert first["compute_ms"] == pytest.approx(100.0)
    assert first["samples_per_s"] == pytest.approx(240.0)


@pytest.mark.timeout(10)
def test_a_row_shows_the_newest_step_and_missing_figures_as_none() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    a = Worker("h:1", 0)
    board.ingest({a.name: a.pulse()})  # pulsing, no step yet
    row, = board.snapshot()["ranks"]
    assert row["step"] == -1 and row["compute_ms"] is None and row["bytes"] is None
    board.ingest({a.name: a.pulse([rec(0, 0.1), rec(1, 0.2, wait_s=None)])})
    row, = board.snapshot()["ranks"]
    assert row["step"] == 1 and row["compute_ms"] == pytest.approx(200.0)
    assert row["wait_ms"] is None  # step 1 carried no wait figure


# --------------------------------------------------------------------------- members


@pytest.mark.timeout(10)
def test_members_are_the_newest_generations_workers_not_done() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    w0, w1, w2 = Worker("h:0", 0, world_size=3), Worker("h:1", 1, world_size=3), \
        Worker("h:2", 2, world_size=3)
    board.ingest({w.name: w.pulse([rec(0)]) for w in (w0, w1, w2)})
    assert [r for r, _ in ranks_of(board.snapshot())] == [0, 1, 2]

    # generation 1 without h:2 (it was lost); h:1 becomes rank 0, h:0 rank 1
    w0.generation = w1.generation = 1
    w0.rank, w1.rank = 1, 0
    board.ingest({w0.name: w0.pulse([rec(1)]), w1.name: w1.pulse([rec(1)]),
                  w2.name: w2.pulse(phase="in the gradient all-reduce of step 1")})
    snap = board.snapshot()
    assert ranks_of(snap) == [(0, "h:1"), (1, "h:0")]
    assert (snap["generation"], snap["world_size"]) == (1, 2)

    # h:0 says it is done: it drops out too
    board.ingest({w0.name: w0.pulse(done=True), w1.name: w1.pulse([rec(2)])})
    snap = board.snapshot()
    assert ranks_of(snap) == [(0, "h:1")]
    assert snap["world_size"] == 1 and snap["step"] == 2


@pytest.mark.timeout(10)
def test_no_member_when_everybody_is_done() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    a = Worker("h:0", 0)
    board.ingest({a.name: a.pulse([rec(0)])})
    board.ingest({a.name: a.pulse(done=True)})
    snap = board.snapshot()
    assert snap["ranks"] == [] and snap["world_size"] == 0 and snap["slowest"] is None
    assert snap["step"] == 0  # what was reached stays


@pytest.mark.timeout(10)
def test_an_old_generations_silent_worker_never_stands_for_the_cohort_again() -> None:
    """A worker lost in generation 0 never says it is done; once generation 1's workers
    are all done, the board shows nobody, not that worker as the whole cohort."""
    clocks = Clocks()
    board = board_of(clocks)
    w0, w1, lost = (Worker("h:0", 0, world_size=3), Worker("h:1", 1, world_size=3),
                    Worker("h:2", 2, world_size=3))
    board.ingest({w.name: w.pulse([rec(0)]) for w in (w0, w1, lost)})
    for w in (w0, w1):
        w.generation, w.world_size = 1, 2
    board.ingest({w0.name: w0.pulse([rec(1)]), w1.name: w1.pulse([rec(1)])})
    board.ingest({w0.name: w0.pulse([rec(2)], done=True),
                  w1.name: w1.pulse([rec(2)], done=True)})
    snap = board.snapshot()
    assert snap["ranks"] == [] and snap["world_size"] == 0 and snap["slowest"] is None
    # the steps that came with the pulses saying done are on the curve too
    assert snap["curves"]["step"] == [0, 1, 2]


@pytest.mark.timeout(10)
def test_a_pulse_with_the_same_seq_is_ignored() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    a = Worker("h:0", 0)
    first = a.pulse([rec(0)], phase="computing step 1")
    board.ingest({a.name: first})
    clocks.advance(2.0)
    # the poller reads the unchanged key again; even a changed body with that seq is old
    board.ingest({a.name: dict(first, phase="computing step 9", steps=[rec(5)])})
    row, = board.snapshot()["ranks"]
    assert row["phase"] == "computing step 1" and row["step"] == 0
    assert row["last_seen_s"] == pytest.approx(2.0)  # not seen again

    board.ingest({a.name: a.pulse([rec(1)], phase="computing step 2")})
    row, = board.snapshot()["ranks"]
    assert row["phase"] == "computing step 2" and row["step"] == 1
    assert row["last_seen_s"] == pytest.approx(0.0)


@pytest.mark.timeout(10)
def test_the_records_of_a_redone_step_replace_the_old_ones() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    a, b = Worker("h:0", 0), Worker("h:1", 1)
    board.ingest({a.name: a.pulse([rec(0), rec(1, 0.5, step_s=2.0, samples=16)]),
                  b.name: b.pulse([rec(0)])})
    # step 1 failed (b never finished it) and is redone by both
    board.ingest({a.name: a.pulse([rec(1, 0.12, step_s=0.4, samples=10)]),
                  b.name: b.pulse([rec(1, 0.1, step_s=0.2, samples=6)])})
    snap = board.snapshot()
    row = snap["ranks"][0]
    assert row["step"] == 1 and row["compute_ms"] == pytest.approx(120.0)
    assert row["samples"] == 10
    # the step's point counts the redone records: (10 + 6) / 0.4 s
    assert snap["curves"]["step"] == [0, 1]
    assert snap["curves"]["samples_per_s"][1] == pytest.approx(40.0)
    assert snap["slowest_history"] == []  # 0.5 s was never judged against anybody


# ------------------------------------------------------------------ slowest_history

# rank 1's compute per step: its 3-step median crosses 1.2 x 100 ms at step 4, and
# falls back at step 8
SLOW = [0.1, 0.1, 0.1, 0.3, 0.3, 0.3, 0.3, 0.1, 0.1, 0.1]
EXPECTED_HISTORY = [
    {"step": 4, "rank": 1,
     "reason": "rank 1: forward+backward 300 ms vs median 100 ms of the others"},
    {"step": 8, "rank": None, "reason": None},
]


def history_of(batches: Sequence[Sequence[tuple[int, range]]]) -> list[dict[str, Any]]:
    """Feed each batch (``[(rank, steps)]`` per ``ingest``) and return the history."""
    board = board_of(Clocks())
    workers = [Worker("h:0", 0), Worker("h:1", 1)]
    computes = [[0.1] * len(SLOW), SLOW]
    for batch in batches:
        board.ingest({workers[rank].name: workers[rank].pulse(
            [rec(s, computes[rank][s]) for s in steps]) for rank, steps in batch})
    return board.snapshot()["slowest_history"]


@pytest.mark.timeout(10)
def test_history_records_exactly_the_steps_where_the_verdict_changed() -> None:
    assert history_of([[(0, range(10)), (1, range(10))]]) == EXPECTED_HISTORY


@pytest.mark.timeout(10)
@pytest.mark.parametrize("batches", [
    # one pulse per worker per step, both workers in each poll
    [[(0, range(s, s + 1)), (1, range(s, s + 1))] for s in range(10)],
    # one pulse per worker per step, one worker per poll
    [[(r, range(s, s + 1))] for s in range(10) for r in (0, 1)],
    # rank 0 far ahead, rank 1 catching up in uneven pulses
    [[(0, range(0, 7)), (1, range(0, 2))], [(1, range(2, 5))], [(0, range(7, 10))],
     [(1, range(5, 6))], [(1, range(6, 10))]],
    # rank 1 ahead
    [[(0, range(0, 1)), (1, range(0, 9))], [(0, range(1, 9))], [(1, range(9, 10))],
     [(0, range(9, 10))]],
], ids=["lockstep", "one-at-a-time", "rank0-ahead", "rank1-ahead"])
def test_history_does_not_depend_on_how_pulses_are_batched(
        batches: list[list[tuple[int, range]]]) -> None:
    assert history_of(batches) == EXPECTED_HISTORY


@pytest.mark.timeout(10)
def test_only_complete_steps_are_judged() -> None:
    # rank 1 has reported up to step 3 only: steps 4.. are not judged yet
    assert history_of([[(0, range(10)), (1, range(4))]]) == []
    assert history_of([[(0, range(10)), (1, range(6))]]) == EXPECTED_HISTORY[:1]


@pytest.mark.timeout(10)
def test_history_does_not_depend_on_which_worker_pulsed_first() -> None:
    assert history_of([[(0, range(10))], [(1, range(10))]]) == EXPECTED_HISTORY


@pytest.mark.timeout(10)
def test_curve_points_count_every_workers_samples_whichever_pulsed_first() -> None:
    board = board_of(Clocks())
    a, b = Worker("h:0", 0), Worker("h:1", 1)
    board.ingest({a.name: a.pulse([rec(s, samples=16, step_s=0.2) for s in range(3)])})
    board.ingest({b.name: b.pulse([rec(s, samples=16, step_s=0.2) for s in range(3)])})
    assert board.snapshot()["curves"]["samples_per_s"] == pytest.approx([160.0] * 3)


@pytest.mark.timeout(10)
def test_snapshot_slowest_names_the_current_bottleneck_since_its_step() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    a, b = Worker("h:0", 0), Worker("h:1", 1)
    board.ingest({a.name: a.pulse([rec(s, 0.1) for s in range(6)]),
                  b.name: b.pulse([rec(s, SLOW[s]) for s in range(6)])})
    assert board.snapshot()["slowest"] == {
        "rank": 1, "reason": "rank 1: forward+backward 300 ms vs median 100 ms of the others",
        "since_step": 4, "silent": False}


# -------------------------------------------------------------------------- curves


@pytest.mark.timeout(10)
def test_curves_sum_samples_over_the_longest_step_and_carry_the_loss() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    a, b = Worker("h:0", 0), Worker("h:1", 1)
    board.ingest({
        a.name: a.pulse([rec(0, samples=20, step_s=0.2, loss=4.0),
                         rec(1, samples=20, step_s=0.25),
                         rec(2, samples=20, step_s=0.2, loss=3.5),
                         rec(3, samples=20, step_s=0.2, loss=3.0)]),  # rank 1 not there yet
        b.name: b.pulse([rec(0, samples=12, step_s=0.4),
                         rec(1, samples=12, step_s=0.2),
                         rec(2, samples=12, step_s=0.16)]),
    })
    curves = board.snapshot()["curves"]
    assert curves["step"] == [0, 1, 2]
    assert curves["loss"] == [4.0, None, 3.5]
    assert curves["samples_per_s"] == pytest.approx([32 / 0.4, 32 / 0.25, 32 / 0.2])


@pytest.mark.timeout(10)
def test_a_curve_point_without_every_sample_count_has_no_speed() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    a, b = Worker("h:0", 0), Worker("h:1", 1)
    board.ingest({a.name: a.pulse([rec(0, samples=None)]), b.name: b.pulse([rec(0)])})
    assert board.snapshot()["curves"]["samples_per_s"] == [None]


# ---------------------------------------------------------------------- efficiency


@pytest.mark.timeout(10)
def test_efficiency_is_none_without_data() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    assert board.snapshot()["efficiency"] is None
    a, b = Worker("h:0", 0), Worker("h:1", 1)
    board.ingest({a.name: a.pulse([rec(0)]), b.name: b.pulse()})  # no complete step
    assert board.snapshot()["efficiency"] is None


@pytest.mark.timeout(10)
def test_efficiency_is_the_median_of_mean_compute_over_the_longest_step() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    a, b = Worker("h:0", 0), Worker("h:1", 1)
    # per step mean(compute) / max(step_s): 0.5, 0.6, 0.9 -> median 0.6 (mean 0.667)
    board.ingest({
        a.name: a.pulse([rec(0, 0.10, step_s=0.2), rec(1, 0.10, step_s=0.18),
                         rec(2, 0.18, step_s=0.2)]),
        b.name: b.pulse([rec(0, 0.10, step_s=0.19), rec(1, 0.14, step_s=0.2),
                         rec(2, 0.18, step_s=0.2)]),
    })
    assert board.snapshot()["efficiency"] == pytest.approx(0.6)


@pytest.mark.timeout(10)
def test_efficiency_looks_at_recent_steps_only_and_is_capped_at_one() -> None:
    clocks = Clocks()
    board = board_of(clocks, AttributionRule(window=1))  # recent: the last 3 steps
    a, b = Worker("h:0", 0), Worker("h:1", 1)
    ratios = [0.1, 0.1, 0.5, 0.6, 0.9]  # all five: median 0.5; the last three: 0.6
    board.ingest({w.name: w.pulse([rec(s, r, step_s=1.0) for s, r in enumerate(ratios)])
                  for w in (a, b)})
    assert board.snapshot()["efficiency"] == pytest.approx(0.6)

    # compute longer than the step (clock skew between the two timers): capped
    board.ingest({w.name: w.pulse([rec(s, 0.3, step_s=0.2) for s in range(5, 8)])
                  for w in (a, b)})
    assert board.snapshot()["efficiency"] == 1.0


# ------------------------------------------------------------------------- silence


@pytest.mark.timeout(10)
def test_a_worker_silent_past_silent_after_s_is_named_and_stale() -> None:
    clocks = Clocks()
    board = board_of(clocks, AttributionRule(silent_after_s=3.0))
    a, b = Worker("h:0", 0), Worker("h:1", 1)
    board.ingest({a.name: a.pulse([rec(0, 0.1)]), b.name: b.pulse(
        [rec(0, 0.1)], phase="in the gradient all-reduce of step 1")})
    clocks.advance(2.0)
    board.ingest({a.name: a.pulse(phase="computing step 1")})
    snap = board.snapshot()
    assert snap["slowest"] is None
    assert [row["stale"] for row in snap["ranks"]] == [False, False]

    clocks.advance(1.5)  # rank 1 silent 3.5 s, rank 0 1.5 s
    board.ingest({a.name: a.pulse(phase="computing step 1")})
    snap = board.snapshot()
    assert snap["slowest"] == {
        "rank": 1, "reason": "rank 1: no report for 3.5 s, last seen in the gradient "
                             "all-reduce of step 1",
        "since_step": None, "silent": True}
    assert [row["stale"] for row in snap["ranks"]] == [False, True]
    assert snap["ranks"][1]["last_seen_s"] == pytest.approx(3.5)

    board.ingest({b.name: b.pulse(phase="computing step 1")})  # it is back
    snap = board.snapshot()
    assert snap["slowest"] is None and not snap["ranks"][1]["stale"]


# -------------------------------------------------------------------------- events

LOSS = {"generation": 1, "cause": "a collective of the step failed", "left": ["h:2"],
        "joined": [], "world_size": 2, "recovery_s": 0.5}
JOIN = {"generation": 2, "cause": "boundary", "left": [], "joined": ["h:3"],
        "world_size": 3, "recovery_s": 1.25}
LEAVE = {"generation": 3, "cause": "boundary", "left": ["h:3"], "joined": [],
         "world_size": 2, "recovery_s": 0.0}


@pytest.mark.timeout(10)
def test_a_cohort_event_in_several_pulses_is_shown_once() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    a, b = Worker("h:0", 0, generation=1), Worker("h:1", 1, generation=1)
    board.ingest({a.name: a.pulse([rec(0), rec(1)], events=[LOSS]),
                  b.name: b.pulse([rec(0)], events=[LOSS])})
    clocks.advance(1.0)
    # every later pulse repeats the cohort's whole event list
    board.ingest({a.name: a.pulse(events=[LOSS, JOIN]), b.name: b.pulse(events=[LOSS, JOIN])})
    clocks.advance(1.0)
    board.ingest({a.name: a.pulse(events=[LOSS, JOIN, LEAVE]),
                  b.name: b.pulse(events=[LOSS, JOIN, LEAVE])})
    assert board.snapshot()["events"] == [
        {"time": WALL, "step": 1, "what": "loss",
         "text": "generation 1: h:2 left (a collective of the step failed); 2 workers, "
                 "recovered in 0.50 s"},
        {"time": WALL + 1.0, "step": 1, "what": "join",
         "text": "generation 2: h:3 joined (boundary); 3 workers, recovered in 1.25 s"},
        {"time": WALL + 2.0, "step": 1, "what": "leave",
         "text": "generation 3: h:3 left (boundary); 2 workers, recovered in 0.00 s"},
    ]


@pytest.mark.timeout(10)
def test_an_event_is_placed_at_the_first_step_of_its_generation() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    a = Worker("h:0", 0, generation=1)
    # steps 4 and 5 of generation 0 went out late, with generation 1's 6 and 7
    board.ingest({a.name: a.pulse([rec(4, generation=0), rec(5, generation=0),
                                   rec(6, generation=1), rec(7, generation=1)],
                                  events=[LOSS])})
    # a pulse with no step of the new generation: the event is placed at the newest step
    board.ingest({a.name: a.pulse([rec(8, generation=1)], events=[LOSS, JOIN])})
    assert [(e["what"], e["step"]) for e in board.snapshot()["events"]] == [
        ("loss", 6), ("join", 8)]


@pytest.mark.timeout(10)
def test_add_event_shows_the_agents_events() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    board.add_event("exit", "worker h:1 exited with code -9")
    a = Worker("h:0", 0)
    board.ingest({a.name: a.pulse([rec(0), rec(1), rec(2)])})
    clocks.advance(3.0)
    board.add_event("checkpoint", "saved step 2")
    assert board.snapshot()["events"] == [
        {"time": WALL, "step": None, "what": "exit", "text": "worker h:1 exited with code -9"},
        {"time": WALL + 3.0, "step": 2, "what": "checkpoint", "text": "saved step 2"},
    ]


@pytest.mark.timeout(10)
def test_a_step_some_member_never_reported_is_not_judged() -> None:
    """Rank 0's records of steps 3-5 never arrived: judged from rank 0's step 2 alone
    (its slow one) those steps would name it; they are left unjudged instead."""
    board = board_of(Clocks())
    a, b = Worker("h:0", 0), Worker("h:1", 1)
    board.ingest({a.name: a.pulse([rec(0, 0.1), rec(1, 0.1), rec(2, 0.5)]),
                  b.name: b.pulse([rec(s, 0.1) for s in range(7)])})
    board.ingest({a.name: a.pulse([rec(6, 0.1)])})  # 3-5 lost
    history = board.snapshot()["slowest_history"]
    assert history == []  # nobody named: not rank 0 at steps 3-5
    assert board.snapshot()["curves"]["step"] == [0, 1, 2, 6]


# --------------------------------------------------------------------------- notes


def a_note(what: str, text: str, step: int, member: str | None = None,
           at: float = WALL) -> dict[str, Any]:
    """A note as a pulse carries it (``events.Note.record`` and its time)."""
    note: dict[str, Any] = {"what": what, "text": text, "step": step, "time": at}
    if member is not None:
        note["member"] = member
    return note


@pytest.mark.timeout(10)
def test_a_note_every_member_sends_is_shown_once_at_its_own_time_and_step() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    a, b = Worker("h:0", 0), Worker("h:1", 1)
    saved = a_note("checkpoint", "step 3 saved to c/step-3.pt (1.0 MB in 0.02 s)", 3,
                   at=WALL - 5.0)
    shares = a_note("rebalance", "samples per rank [40, 24]", 4, at=WALL - 4.0)
    board.ingest({a.name: a.pulse([rec(4)], notes=[saved]), b.name: b.pulse([rec(4)])})
    # the publisher repeats its last notes in every pulse; b sends the same rebalance
    board.ingest({a.name: a.pulse([rec(5)], notes=[saved, shares]),
                  b.name: b.pulse([rec(5)], notes=[shares])})
    assert board.snapshot()["events"] == [
        {"time": WALL - 5.0, "step": 3, "what": "checkpoint",
         "text": "step 3 saved to c/step-3.pt (1.0 MB in 0.02 s)"},
        {"time": WALL - 4.0, "step": 4, "what": "rebalance", "text": "samples per rank [40, 24]"},
    ]


@pytest.mark.timeout(10)
def test_trust_notes_set_the_members_trust_cell() -> None:
    board = board_of(Clocks())
    a, b = Worker("h:0", 0), Worker("h:1", 1)
    board.ingest({a.name: a.pulse([rec(0)]), b.name: b.pulse([rec(0)])})
    assert [row["trust"] for row in board.snapshot()["ranks"]] == [None, None]
    strike = a_note("strike", "rank 1 (m-h:1): far (3.1 x the radius)", 7, member="m-h:1")
    board.ingest({a.name: a.pulse([rec(1)], notes=[strike]),
                  b.name: b.pulse([rec(1)], notes=[strike])})
    assert [row["trust"] for row in board.snapshot()["ranks"]] == [None, "struck (step 7)"]
    gone = a_note("quarantine", "rank 1 (m-h:1): step 7: far; step 8: far", 8, member="m-h:1")
    board.ingest({a.name: a.pulse([rec(2)], notes=[strike, gone]), b.name: b.pulse([rec(2)])})
    snapshot = board.snapshot()
    assert [row["trust"] for row in snapshot["ranks"]] == [None, "quarantined (step 8)"]
    assert [e["what"] for e in snapshot["events"]] == ["strike", "quarantine"]


@pytest.mark.timeout(10)
def test_a_restarted_fixed_job_shows_only_its_new_workers_and_judges_their_steps() -> None:
    clocks = Clocks()
    board = board_of(clocks)
    old = [Worker("h:10", 0), Worker("h:11", 1)]
    board.ingest({w.name: w.pulse([rec(s, 0.1 if w.rank == 0 else 0.3, loss=1.0)
                                   for s in range(10)]) for w in old})
    assert board.snapshot()["slowest_history"][-1]["rank"] == 1
    clocks.advance(10.0)  # the launcher restarts every worker; they resume from step 3
    new = [Worker("h:20", 0, attempt=1), Worker("h:21", 1, attempt=1)]
    board.ingest({w.name: w.pulse([rec(s, 0.3 if w.rank == 0 else 0.1, loss=2.0)
                                   for s in range(3, 8)]) for w in new})
    # a dead worker's last pulse read after the new ones changes nothing
    board.ingest({w.name: w.pulse([rec(10, loss=1.0)]) for w in old})
    snapshot = board.snapshot()
    assert ranks_of(snapshot) == [(0, "h:20"), (1, "h:21")]  # not the dead ones, not stale
    assert snapshot["step"] == 7
    assert [e["what"] for e in snapshot["events"]] == ["restart"]
    # steps 3..7 were judged again with the new workers: now rank 0 is the slow one, and
    # nothing the last attempt said about step 3 on is left
    assert snapshot["slowest"]["rank"] == 0
    assert all(h["step"] < 3 or h["rank"] == 0 for h in snapshot["slowest_history"])
    assert snapshot["slowest"]["since_step"] <= 7
    assert snapshot["curves"]["step"] == list(range(8))
    assert snapshot["curves"]["loss"] == [1.0] * 3 + [2.0] * 5  # the old tail is gone


@pytest.mark.timeout(10)
def test_trust_standing_and_notes_do_not_leak_into_a_restarted_attempt() -> None:
    board = board_of(Clocks())
    old = [Worker("h:10", 0), Worker("h:11", 1)]
    gone = a_note("quarantine", "rank 1 (m-rank1): far", 8, member="m-h:21")
    board.ingest({w.name: w.pulse([rec(8)], notes=[gone]) for w in old})
    new = [Worker("h:20", 0, attempt=1), Worker("h:21", 1, attempt=1)]
    board.ingest({w.name: w.pulse([rec(8)]) for w in new})
    assert [row["trust"] for row in board.snapshot()["ranks"]] == [None, None]
    # the same verdict again in the new attempt is news, and its standing counts
    board.ingest({w.name: w.pulse([rec(9)], notes=[gone]) for w in new})
    snapshot = board.snapshot()
    assert [row["trust"] for row in snapshot["ranks"]] == [None, "quarantined (step 8)"]
    assert [e["what"] for e in snapshot["events"]] == ["quarantine", "restart", "quarantine"]


# ---------------------------------------------------------------------- StorePoller


def hash_store() -> dist.HashStore:
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=5))  # a get that would block fails instead
    return store


def publish(store: dist.Store, worker: str, pulse: dict[str, Any]) -> None:
    store.set(keys.status_pulse(RUN, worker), json.dumps(pulse))


@pytest.mark.timeout(20)
def test_poller_reads_every_registered_workers_pulse() -> None:
    store = hash_store()
    poller = StorePoller(lambda: store, StatusBoard(RUN), RUN)
    assert poller.poll(store) == {}  # nobody registered yet

    a, b = Worker("h:0", 0), Worker("h:1", 1)
    for slot, worker in enumerate((a, b)):
        assert store.add(keys.status_count(RUN), 1) == slot + 1
        store.set(keys.status_slot(RUN, slot), worker.name)
    first = a.pulse([rec(0)])
    publish(store, a.name, first)
    assert poller.poll(store) == {a.name: first}  # b registered, no pulse yet

    second = b.pulse([rec(0)])
    publish(store, b.name, second)
    again = a.pulse([rec(1)])
    publish(store, a.name, again)
    assert poller.poll(store) == {a.name: again, b.name: second}


@pytest.mark.timeout(20)
def test_poller_skips_a_counted_slot_whose_name_is_not_written_yet() -> None:
    store = hash_store()
    board = StatusBoard(RUN)
    poller = StorePoller(lambda: store, board, RUN)
    a, b = Worker("h:0", 0), Worker("h:1", 1)
    store.add(keys.status_count(RUN), 1)
    store.set(keys.status_slot(RUN, 0), a.name)
    publish(store, a.name, a.pulse([rec(0)]))
    store.add(keys.status_count(RUN), 1)  # b counted itself, its name comes next
    publish(store, b.name, b.pulse([rec(0)]))

    started = time.monotonic()
    pulses = poller.poll(store)
    assert time.monotonic() - started < 1.0  # did not block on the missing slot key
    assert list(pulses) == [a.name]

    store.set(keys.status_slot(RUN, 1), b.name)
    pulses = poller.poll(store)
    assert sorted(pulses) == [a.name, b.name]
    board.ingest(pulses)
    assert ranks_of(board.snapshot()) == [(0, a.name), (1, b.name)]
