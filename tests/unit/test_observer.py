"""``StepObserver`` timing steps by hand; ``StorePublisher`` and ``JournalSink`` sinks."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from potluck import events, keys
from potluck.events import Note
from potluck.metrics.journal import read_journal
from potluck.metrics.observer import Position, StepFigures, StepObserver, describe
from potluck.metrics.publisher import JournalSink, StorePublisher
from potluck.reducer.clock import ComputeClock
from potluck.reducer.reducer import PassStats
from potluck.status.board import StatusBoard, StorePoller

WHERE = (1, 2, 3)  # rank, world_size, generation


class Passes:
    """What the reducer's ``last_pass`` would hold; the test sets it."""

    def __init__(self) -> None:
        self.stats = PassStats()

    def __call__(self) -> PassStats:
        return self.stats


class ListSink:
    def __init__(self) -> None:
        self.written: list[StepFigures] = []
        self.notes: list[Note] = []
        self.closed = False

    def write(self, figures: StepFigures) -> None:
        self.written.append(figures)

    def note(self, note: Note) -> None:
        self.notes.append(note)

    def close(self) -> None:
        self.closed = True


class BrokenSink(ListSink):
    def close(self) -> None:
        raise OSError("disk gone")


class InnerClock:
    """A balancer's clock: records the calls passed on to it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def forward_started(self) -> None:
        self.calls.append("forward_started")

    def backward_done(self, waited: float = 0.0) -> None:
        self.calls.append("backward_done")


def make_observer(passes: Passes, **kwargs: Any) -> StepObserver:
    return StepObserver(ComputeClock("cpu"), lambda: WHERE, passes, worker="h:7", **kwargs)


def phase(observer: StepObserver) -> str:
    return describe(observer.position())


def compute_for(observer: StepObserver, seconds: float) -> tuple[float, float, float]:
    """forward ... backward over ``seconds``: (before forward, before backward_done,
    after backward_done) instants."""
    started = time.perf_counter()
    observer.forward_started()
    time.sleep(seconds)
    before = time.perf_counter()
    observer.backward_done()
    return started, before, time.perf_counter()


# ------------------------------------------------------------------------ one step


@pytest.mark.timeout(10)
def test_a_step_is_timed_from_forward_to_the_all_reduces_end() -> None:
    passes, sink = Passes(), ListSink()
    constructed = time.perf_counter()
    observer = make_observer(passes, samples=lambda: (8, 32), sinks=[sink])
    constructed_after = time.perf_counter()
    assert phase(observer) == "starting"

    forward_at = time.perf_counter()
    observer.forward_started()
    assert phase(observer) == "computing step 0"
    time.sleep(0.005)
    launched = time.perf_counter()  # the first bucket goes while backward still runs
    time.sleep(0.003)
    before_done = time.perf_counter()
    observer.backward_done()
    after_done = time.perf_counter()
    assert phase(observer) == "in the gradient all-reduce of step 0"
    time.sleep(0.004)
    settled = time.perf_counter()
    passes.stats = PassStats(launched_at=launched, settled_at=settled, bytes=4096)
    observer.report(loss=2.5)
    before_commit = time.perf_counter()
    figures = observer.committed()
    after_commit = time.perf_counter()

    assert figures.compute_s is not None and figures.wait_s is not None
    assert 0.008 <= figures.compute_s <= after_done - forward_at
    assert settled - after_done <= figures.wait_s <= settled - before_done
    assert figures.wait_s >= 0.004
    assert figures.comm_s == pytest.approx(settled - launched)
    assert figures.step_s is not None
    # from the observer's start (no previous step) to the commit
    assert before_commit - constructed_after <= figures.step_s <= after_commit - constructed
    assert figures.bytes == 4096
    assert (figures.step, figures.rank, figures.world_size, figures.generation) == (0, *WHERE)
    assert (figures.worker, figures.host) == ("h:7", socket.gethostname())
    assert (figures.samples, figures.share, figures.loss) == (8, 0.25, 2.5)
    assert figures.samples_per_s == pytest.approx(8 / figures.compute_s)
    assert sink.written == [figures]
    assert phase(observer) == "between steps, before step 1"


@pytest.mark.timeout(10)
def test_the_next_step_starts_clean() -> None:
    passes, sink = Passes(), ListSink()
    observer = make_observer(passes, sinks=[sink])
    compute_for(observer, 0.002)
    passes.stats = PassStats(launched_at=time.perf_counter(),
                             settled_at=time.perf_counter(), bytes=100)
    observer.report(loss=1.0)
    first = observer.committed()
    assert first.loss == 1.0 and first.bytes == 100 and first.samples is None

    # no pass settled after this step's backward (a local step): the last one is stale
    started, _, done = compute_for(observer, 0.002)
    second = observer.committed()
    assert passes.stats.settled_at is not None and passes.stats.settled_at < done
    assert second.step == 1 and second.loss is None  # the loss was the first step's
    assert (second.wait_s, second.comm_s, second.bytes) == (None, None, 0)
    assert second.compute_s is not None and 0.002 <= second.compute_s <= done - started
    assert second.step_s is not None and second.step_s > second.compute_s
    assert (second.share, second.samples_per_s) == (None, None)
    assert sink.written == [first, second]


@pytest.mark.timeout(10)
def test_an_explicit_step_index_names_the_next_one() -> None:
    observer = make_observer(Passes())
    compute_for(observer, 0.0)
    assert observer.committed(41).step == 41
    assert phase(observer) == "between steps, before step 42"
    observer.forward_started()
    assert phase(observer) == "computing step 42"
    observer.backward_done()
    observer.step_started()
    assert phase(observer) == "in the optimizer update of step 42"
    assert observer.committed().step == 42


@pytest.mark.timeout(10)
def test_time_blocked_in_the_steps_own_collectives_is_waiting() -> None:
    observer = make_observer(Passes())  # no synchronized pass at all (DiLoCo)
    compute_for(observer, 0.001)
    observer.moving("in the round's sync after step {step}")
    assert phase(observer) == "in the round's sync after step 0"
    observer.blocked("the round's sync", 0.25)
    figures = observer.committed()
    assert figures.wait_s == pytest.approx(0.25)
    assert (figures.comm_s, figures.bytes) == (None, 0)
    compute_for(observer, 0.001)
    assert observer.committed().wait_s is None  # the sync was the previous step's


@pytest.mark.timeout(10)
def test_a_step_without_forward_has_no_compute() -> None:
    figures = make_observer(Passes(), samples=lambda: (4, 0)).committed()
    assert figures.compute_s is None and figures.samples_per_s is None
    assert figures.samples == 4 and figures.share is None  # no global batch to divide


@pytest.mark.timeout(10)
def test_an_abandoned_step_is_void() -> None:
    passes = Passes()
    observer = make_observer(passes)
    compute_for(observer, 0.05)
    abandoned_at = time.perf_counter()
    observer.abandoned()
    assert phase(observer) == "redoing step 0"

    redo_started, _, redo_done = compute_for(observer, 0.002)
    figures = observer.committed()
    assert figures.step == 0
    assert figures.compute_s is not None
    assert 0.002 <= figures.compute_s <= redo_done - redo_started  # not the 50 ms before
    # the step's wall time starts at the abandon, not before the failed attempt
    assert figures.step_s is not None
    assert redo_done - redo_started <= figures.step_s <= time.perf_counter() - abandoned_at


@pytest.mark.timeout(10)
def test_an_inner_clock_hears_forward_and_backward() -> None:
    inner = InnerClock()
    observer = make_observer(Passes(), inner=inner)
    compute_for(observer, 0.0)
    observer.forward_started()  # a second micro-batch
    observer.backward_done()
    assert inner.calls == ["forward_started", "backward_done"] * 2


@pytest.mark.timeout(10)
def test_the_position_moves_forward_in_time() -> None:
    observer = make_observer(Passes())
    before = observer.position()
    time.sleep(0.001)
    observer.forward_started()
    now = observer.position()
    assert now.since > before.since and (now.phase, now.step) == ("computing step {step}", 0)


@pytest.mark.timeout(10)
def test_close_closes_every_sink_even_past_a_failing_one() -> None:
    broken, fine = BrokenSink(), ListSink()
    observer = make_observer(Passes(), sinks=[broken])
    observer.add_sink(fine)
    observer.committed()
    assert len(broken.written) == len(fine.written) == 1
    observer.close()  # does not raise
    assert fine.closed


@pytest.mark.timeout(10)
def test_notes_reach_the_sinks_from_any_thread_until_close(tmp_path: Path) -> None:
    sink, journal = ListSink(), JournalSink(tmp_path)
    observer = make_observer(Passes(), sinks=[sink, journal])
    events.note("checkpoint", "before anybody listened", step=0)
    observer.hear_notes()
    observer.hear_notes()  # once is enough: each note reaches a sink once
    events.note("rebalance", "samples per rank [40, 24]", step=4)
    writer = threading.Thread(target=events.note, args=("checkpoint", "step 5 saved"),
                              kwargs={"step": 5})
    writer.start()
    writer.join()
    observer.close()
    events.note("checkpoint", "after close", step=6)
    assert sink.notes == [Note("rebalance", "samples per rank [40, 24]", 4),
                          Note("checkpoint", "step 5 saved", 5)]
    records = read_journal(journal.path)
    assert [(r["kind"], r["what"], r["step"], r["text"]) for r in records] == [
        ("event", "rebalance", 4, "samples per rank [40, 24]"),
        ("event", "checkpoint", 5, "step 5 saved")]


class NoteFailingSink(ListSink):
    def note(self, note: Note) -> None:
        raise OSError("disk full")


@pytest.mark.timeout(10)
def test_a_sink_failing_on_a_note_is_dropped_and_the_others_still_hear(
        tmp_path: Path) -> None:
    broken, fine, journal = NoteFailingSink(), ListSink(), JournalSink(tmp_path)
    observer = make_observer(Passes(), sinks=[broken, fine, journal])
    observer.hear_notes()
    try:
        events.note("checkpoint", "one", step=1)
        events.note("checkpoint", "two", step=2)
        observer.committed()
    finally:
        observer.close()
    assert [n.text for n in fine.notes] == ["one", "two"]
    assert broken.written == []  # dropped at its first failure: no steps either
    assert broken.closed  # and closed with the others (it may hold a file)
    journal.note(Note("checkpoint", "after the end", 3))  # racing the close: dropped
    records = read_journal(journal.path)
    assert [r.get("text") for r in records if r["kind"] == "event"] == ["one", "two"]


@pytest.mark.timeout(10)
def test_a_failing_listener_is_dropped_and_a_bad_note_refused() -> None:
    heard: list[Note] = []

    def broken(note: Note) -> None:
        raise RuntimeError("listener bug")

    stop_broken, stop_heard = events.listen(broken), events.listen(heard.append)
    try:
        events.note("repair", "one", step=1)  # does not raise
        events.note("repair", "two", step=2)
        with pytest.raises(ValueError, match="'chekpoint' is not one of checkpoint"):
            events.note("chekpoint", "typo")
    finally:
        stop_broken()  # already gone: no error
        stop_heard()
    assert [n.text for n in heard] == ["one", "two"]


# ------------------------------------------------------------------- StepFigures


def figures(**over: Any) -> StepFigures:
    base: dict[str, Any] = {"step": 5, "rank": 0, "world_size": 2, "generation": 1,
                            "worker": "h:1", "host": "h", "compute_s": 0.2, "wait_s": 0.1,
                            "comm_s": 0.15, "step_s": 0.3, "bytes": 2048}
    base.update(over)
    return StepFigures(**base)


@pytest.mark.timeout(10)
def test_record_omits_none_fields_and_adds_samples_per_s() -> None:
    full = figures(samples=10, share=0.5, loss=3.25).record()
    assert full == {"step": 5, "rank": 0, "world_size": 2, "generation": 1, "worker": "h:1",
                    "host": "h", "compute_s": 0.2, "wait_s": 0.1, "comm_s": 0.15,
                    "step_s": 0.3, "bytes": 2048, "samples": 10, "share": 0.5,
                    "loss": 3.25, "samples_per_s": pytest.approx(50.0)}
    bare = figures(wait_s=None, comm_s=None).record()
    assert set(bare) == {"step", "rank", "world_size", "generation", "worker", "host",
                         "compute_s", "step_s", "bytes"}
    assert "samples_per_s" not in figures(samples=10, compute_s=None).record()
    assert "samples_per_s" not in figures(samples=10, compute_s=0.0).record()
    assert figures(samples=10, compute_s=0.0).record()["compute_s"] == 0.0


# ------------------------------------------------------------------- JournalSink


@pytest.mark.timeout(10)
def test_journal_sink_writes_rank_step_records(tmp_path: Path) -> None:
    sink = JournalSink(tmp_path)
    assert sink.path == tmp_path / "ranks" / f"rank-{os.getpid()}.jsonl"
    written = [figures(step=0, samples=4, loss=2.0), figures(step=1, wait_s=None)]
    for each in written:
        sink.write(each)
    sink.close()
    records = read_journal(sink.path)
    assert [r["kind"] for r in records] == ["rank_step", "rank_step"]
    assert all(r["pid"] == os.getpid() and r["time"] > 1e9 for r in records)
    for record, each in zip(records, written, strict=True):
        assert {k: v for k, v in record.items() if k not in ("kind", "time", "pid")} == \
            each.record()


# ---------------------------------------------------------------- StorePublisher

RUN = "run-obs"


class RecordingStore:
    """A HashStore that keeps every value set on it (a pulse key is overwritten)."""

    def __init__(self) -> None:
        self.inner = dist.HashStore()
        self._lock = threading.Lock()
        self.sets: list[tuple[str, str]] = []

    def add(self, key: str, amount: int) -> int:
        return int(self.inner.add(key, amount))

    def set(self, key: str, value: str) -> None:
        with self._lock:
            self.sets.append((key, value))
        self.inner.set(key, value)

    def check(self, keys_: list[str]) -> bool:
        return bool(self.inner.check(keys_))

    def get(self, key: str) -> bytes:
        return bytes(self.inner.get(key))

    def pulses(self, worker: str) -> list[dict[str, Any]]:
        key = keys.status_pulse(RUN, worker)
        with self._lock:
            return [json.loads(value) for k, value in self.sets if k == key]


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def steps_in(pulses: list[dict[str, Any]]) -> list[int]:
    """Every step the pulses carried, once (each pulse repeats the last ones)."""
    return sorted({record["step"] for pulse in pulses for record in pulse["steps"]})


@pytest.fixture
def no_thread_left() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] == []


EVENT = {"generation": 3, "cause": "boundary", "left": [], "joined": ["h:9"],
         "world_size": 2, "recovery_s": 0.1}


@pytest.mark.timeout(20)
def test_publisher_pulses_each_step_once_then_says_done(no_thread_left: None) -> None:
    store = RecordingStore()
    since = time.perf_counter()
    publisher = StorePublisher(
        lambda: store, RUN, "h:7", position=lambda: Position("computing step {step}", 4, since),
        where=lambda: WHERE, events=lambda: [EVENT], interval=0.01).start()
    try:
        for step in range(3):
            publisher.write(figures(step=step))
        wait_for(lambda: steps_in(store.pulses("h:7")) == [0, 1, 2])
        for step in range(3, 5):
            publisher.write(figures(step=step))
        wait_for(lambda: steps_in(store.pulses("h:7")) == [0, 1, 2, 3, 4])
        publisher.write(figures(step=5))  # written just before the end
    finally:
        publisher.close()

    assert store.add(keys.status_count(RUN), 0) == 1
    assert store.get(keys.status_slot(RUN, 0)) == b"h:7"
    pulses = store.pulses("h:7")
    assert len(pulses) >= 3
    assert [p["seq"] for p in pulses] == list(range(1, len(pulses) + 1))
    assert steps_in(pulses) == [0, 1, 2, 3, 4, 5]
    # every pulse carries the last steps, so one the poller missed costs nothing
    assert [r["step"] for r in pulses[-1]["steps"]] == [0, 1, 2, 3, 4, 5]
    assert [p["done"] for p in pulses] == [False] * (len(pulses) - 1) + [True]
    assert json.loads(store.get(keys.status_pulse(RUN, "h:7"))) == pulses[-1]
    for pulse in pulses:
        assert (pulse["worker"], pulse["pid"]) == ("h:7", os.getpid())
        assert (pulse["rank"], pulse["world_size"], pulse["generation"]) == WHERE
        assert pulse["phase"] == "computing step 4" and pulse["phase_s"] >= 0
        assert pulse["events"] == [EVENT]


@pytest.mark.timeout(20)
def test_a_pulse_carries_every_step_since_the_last_one_and_64_before() -> None:
    """Steps of about 1 ms make hundreds between two pulses: none may be left out (a
    board that judged a step from some ranks' records would name the wrong rank)."""
    publisher = StorePublisher(
        lambda: RecordingStore(), RUN, "h:9",
        position=lambda: Position("starting", 0, time.perf_counter()), where=lambda: WHERE)
    for step in range(300):
        publisher.write(figures(step=step))
    assert [r["step"] for r in publisher.pulse()["steps"]] == list(range(300))
    for step in range(300, 310):
        publisher.write(figures(step=step))
    assert [r["step"] for r in publisher.pulse()["steps"]] == list(range(310 - 74, 310))
    assert [r["step"] for r in publisher.pulse()["steps"]] == list(range(310 - 64, 310))


@pytest.mark.timeout(20)
def test_a_pulse_carries_the_last_notes_the_member_and_the_attempt(
        no_thread_left: None) -> None:
    store = RecordingStore()
    publisher = StorePublisher(
        lambda: store, RUN, "h:8", position=lambda: Position("starting", 0, time.perf_counter()),
        where=lambda: WHERE, member="h:8:beef", attempt=2, interval=0.01)
    for index in range(25):
        publisher.note(Note("checkpoint", f"step {index} saved", index))
    publisher.note(Note("strike", "rank 1 (x): far", 25, member="x"))
    pulse = publisher.pulse()
    assert (pulse["member"], pulse["attempt"]) == ("h:8:beef", 2)
    assert len(pulse["notes"]) == 20  # the newest: a poller that missed some gets them
    assert [n["step"] for n in pulse["notes"]] == list(range(6, 26))
    assert {k: v for k, v in pulse["notes"][-1].items() if k != "time"} == {
        "what": "strike", "text": "rank 1 (x): far", "step": 25, "member": "x"}
    assert pulse["notes"][-1]["time"] > 1e9


@pytest.mark.timeout(20)
def test_close_sends_the_pending_steps_in_a_final_done_pulse(no_thread_left: None) -> None:
    store = RecordingStore()
    publisher = StorePublisher(
        lambda: store, RUN, "h:8", position=lambda: Position("starting", 0, 0.0),
        where=lambda: WHERE, interval=60.0).start()  # no regular pulse in this test
    publisher.write(figures(step=0))
    publisher.write(figures(step=1, loss=0.5))
    started = time.monotonic()
    publisher.close()
    assert time.monotonic() - started < 2.0  # the thread's wait ends at once
    pulse, = store.pulses("h:8")
    assert (pulse["seq"], pulse["done"], pulse["phase"], pulse["events"]) == (
        1, True, "starting", [])
    assert pulse["steps"] == [figures(step=0).record(), figures(step=1, loss=0.5).record()]


@pytest.mark.timeout(20)
def test_publishers_feed_a_poller_and_a_board(no_thread_left: None) -> None:
    store = RecordingStore()
    since = time.perf_counter()
    publishers = [StorePublisher(
        lambda: store, RUN, f"h:{rank}", where=lambda r=rank: (r, 2, 0),
        position=lambda: Position("computing step {step}", 1, since),
        interval=0.01).start() for rank in (1, 0)]
    poller = StorePoller(lambda: store, StatusBoard(RUN), RUN)
    board = StatusBoard(RUN)
    try:
        for rank, publisher in zip((1, 0), publishers, strict=True):
            publisher.write(figures(step=0, rank=rank, worker=f"h:{rank}"))

        def both_in() -> bool:
            board.ingest(poller.poll(store))
            return [row["step"] for row in board.snapshot()["ranks"]] == [0, 0]

        wait_for(both_in)
    finally:
        for publisher in publishers:
            publisher.close()
    snap = board.snapshot()
    assert [(row["rank"], row["worker"]) for row in snap["ranks"]] == [(0, "h:0"), (1, "h:1")]
    assert snap["curves"]["step"] == [0]
    board.ingest(poller.poll(store))
    assert board.snapshot()["ranks"] == []  # both said they are done
