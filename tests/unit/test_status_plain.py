"""A ``potluck.DataParallel`` built without ``potluck.prepare``: how its steps are
seen (``watch_models``, ``metrics.plain.PlainModels``), what the page says of it
(``board.notices``) and what the launcher says (``launch.worker.UnusedFlags``).

One process, no process group: a model of world size 1 still ends a step at each
backward that would average, so the boundaries are tested without peers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from potluck import DataParallel
from potluck.env import WorkerEnv
from potluck.launch import worker
from potluck.metrics.journal import read_journal
from potluck.metrics.plain import PlainModels
from potluck.reducer.data_parallel import watch_models
from potluck.status.board import notices


class Watch:
    """A ``StepWatch`` that counts what the model told it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def forward_started(self) -> None:
        self.calls.append("forward")

    def backward_done(self, waited: float = 0.0) -> None:
        self.calls.append("backward")

    def committed(self) -> None:
        self.calls.append("committed")

    def abandoned(self) -> None:
        self.calls.append("abandoned")


@pytest.fixture
def watches() -> Iterator[list[Watch]]:
    """Every model built in the test gets a fresh ``Watch`` (listed here)."""
    made: list[Watch] = []

    def factory(model: DataParallel) -> Watch:
        made.append(Watch())
        return made[-1]

    stop = watch_models(factory)
    try:
        yield made
    finally:
        stop()


def _step(model: DataParallel, micro_batches: int = 1) -> None:
    """One optimizer step's passes: all but the last under ``no_sync()``."""
    for index in range(micro_batches):
        x = torch.randn(2, 3)
        if index < micro_batches - 1:
            with model.no_sync():
                model(x).sum().backward()
        else:
            model(x).sum().backward()


def test_a_step_ends_at_each_backward_that_averages(watches: list[Watch]) -> None:
    model = DataParallel(nn.Linear(3, 1))
    _step(model)
    _step(model, micro_batches=3)
    with torch.no_grad():
        model(torch.randn(2, 3))  # an evaluation forward: no step, no timing
    (watch,) = watches
    assert watch.calls == ["forward", "backward", "committed",
                           "forward", "backward", "forward", "backward",
                           "forward", "backward", "committed"]


def test_a_model_given_a_clock_is_not_watched(watches: list[Watch]) -> None:
    DataParallel(nn.Linear(3, 1), clock=Watch())
    assert watches == []


def test_a_backward_that_raised_abandons_its_step(watches: list[Watch]) -> None:
    model = DataParallel(nn.Linear(3, 1))

    def fail(grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")

    hook = model.module.weight.register_hook(fail)  # after the step's end was queued
    with pytest.raises(RuntimeError, match="boom"):
        model(torch.randn(2, 3)).sum().backward()
    hook.remove()
    _step(model)
    assert watches[0].calls == ["forward", "abandoned", "forward", "backward", "committed"]


def test_a_failing_factory_or_watch_never_stops_training() -> None:
    def broken(model: DataParallel) -> Watch:
        raise OSError("no store")

    stop = watch_models(broken)
    try:
        model = DataParallel(nn.Linear(3, 1))  # not watched, still built
        _step(model)
    finally:
        stop()

    class Failing(Watch):
        def committed(self) -> None:
            raise OSError("disk gone")

    failing = Failing()
    stop = watch_models(lambda model: failing)
    try:
        model = DataParallel(nn.Linear(3, 1))
        _step(model)
        _step(model)  # the watch was dropped after its failure: no second call
    finally:
        stop()
    assert failing.calls == ["forward", "backward"]


def test_plain_models_journal_one_record_per_step_without_samples(tmp_path: Path) -> None:
    # (prepared: this test process may have run potluck.prepare in another test)
    plain = PlainModels(WorkerEnv(metrics_dir=str(tmp_path)), prepared=lambda: False).start()
    try:
        model = DataParallel(nn.Linear(3, 1))
        other = DataParallel(nn.Linear(3, 1))  # a second model: not observed
        for _ in range(3):
            _step(model, micro_batches=2)
            _step(other)
        assert plain.watched and not plain.on_cohort
    finally:
        plain.close()
    (journal,) = (tmp_path / "ranks").glob("rank-*.jsonl")
    records = [r for r in read_journal(journal) if r["kind"] == "rank_step"]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(r["rank"] == 0 and r["world_size"] == 1 and r["generation"] == 0
               and r["compute_s"] > 0 and "samples" not in r and "share" not in r
               for r in records), records
    after = DataParallel(nn.Linear(3, 1))  # closed: no longer watching
    _step(after)
    assert len(read_journal(journal)) == len(records)


def test_a_process_that_ran_prepare_is_not_watched_again(tmp_path: Path) -> None:
    plain = PlainModels(WorkerEnv(metrics_dir=str(tmp_path)), prepared=lambda: True).start()
    try:
        _step(DataParallel(nn.Linear(3, 1)))
        assert not plain.watched
    finally:
        plain.close()
    assert not (tmp_path / "ranks").exists()


def test_the_page_says_which_ranks_count_no_samples() -> None:
    assert notices([{"rank": 0}, {"rank": 1, "counts_samples": True}]) == []
    (one,) = notices([{"rank": 1, "counts_samples": False}, {"rank": 0}])
    assert one.startswith("rank 1 trains a potluck.DataParallel without potluck.prepare: ")
    assert "samples/s, shares and the throughput curve stay blank" in one
    (both,) = notices([{"rank": 1, "counts_samples": False},
                       {"rank": 0, "counts_samples": False}])
    assert both.startswith("ranks 0, 1 train a potluck.DataParallel without")


def _line(flags: list[str], front: str | None) -> str | None:
    watch = worker.UnusedFlags(flags, "runs/m", prepared=lambda: False, say=print,
                               front=lambda: front)
    line: str | None = watch.line(None)
    return line


def test_the_launcher_says_what_each_flag_does_not_do_for_a_plain_model() -> None:
    everything = ["--status-port", "--metrics-dir", "--balance", "--elastic"]
    assert worker.prepare_flags(WorkerEnv(status=True, metrics_dir="m", balance=True,
                                          elastic=True)) == everything
    plain = _line(everything, "plain")
    assert plain is not None and plain.startswith(
        "potluck: this script trains a potluck.DataParallel without potluck.prepare(...), "
        "so it gets less from --status-port (the page shows its step times, not its "
        "samples/s, shares or loss); --metrics-dir (the journals in runs/m hold ")
    assert "--balance (nothing: every worker keeps an equal share)" in plain
    assert "--elastic (a lost worker restarts with all the others" in plain
    cohort = _line(everything, "cohort")  # potluck.init(): its workers rejoin alone
    assert cohort is not None and "--elastic" not in cohort and "--balance" in cohort
    # No potluck.DataParallel seen: the flags did nothing (the agent says --elastic's
    # part itself if a worker is lost).
    nothing = _line(everything, None)
    assert nothing == worker.unused_flags_line(everything[:3], "runs/m")
    assert nothing is not None and "wrapped" in nothing and "in potluck.DataParallel" in nothing
    assert _line(["--elastic"], None) is None


def test_only_a_plain_models_pulses_say_they_count_no_samples(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A prepared run without per-step samples (DiLoCo's local steps) is no plain
    script: its page must not say "without potluck.prepare"."""
    from potluck.metrics import observing
    from potluck.reducer.clock import ComputeClock

    said: list[bool] = []

    class Publisher:
        def __init__(self, *args: object, counts_samples: bool, **kwargs: object) -> None:
            said.append(counts_samples)

        def start(self) -> Publisher:
            return self

    monkeypatch.setattr(observing, "StorePublisher", Publisher)
    monkeypatch.setattr(observing, "store_client", lambda addr, port: None)
    env = WorkerEnv(status=True, master_addr="127.0.0.1", master_port=1)
    for prepared in (True, False):
        observing.make_observer(ComputeClock(torch.device("cpu")), lambda: (0, 1, 0), None,
                                env, samples=None, prepared=prepared)
    assert said == [True, False]
