"""``potluck plot``: series from a synthetic run's journals (last record of a step wins,
fallbacks to the rank records), the PNGs written, and the command's output and errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from potluck import cli
from potluck.errors import ConfigError
from potluck.metrics.journal import Journal
from potluck.metrics.plots import load_run, write_plots

T0 = 1_700_000_000.0
STEPS, BATCH, CHANGE, REDONE = 30, 16, 15, 12
PNG = b"\x89PNG\r\n\x1a\n"


def _write(journal: Journal, kind: str, at: float, **fields: Any) -> None:
    """``journal.write``, or the same line by hand while ``rank_step`` is not yet a kind."""
    try:
        journal.write(kind, at=at, **fields)
    except ValueError:
        record = {"kind": kind, "time": at, "pid": journal.pid, **fields}
        with journal.path.open("a") as file:
            file.write(json.dumps(record) + "\n")


def _share(rank: int, step: int) -> float:
    if step < CHANGE:
        return 0.5
    return 0.625 if rank == 0 else 0.375


def _rank_step(journal: Journal, rank: int, step: int, at: float, *, compute_s: float,
               loss: float | None = None, step_s: float = 0.25) -> None:
    share = _share(rank, step)
    fields = dict(rank=rank, world_size=2, generation=0 if step < REDONE else 1,
                  worker=f"host:{100 + rank}", host="host", step=step,
                  samples=int(share * BATCH), share=share, compute_s=compute_s,
                  wait_s=0.1 if rank == 0 else 0.0, comm_s=0.05, step_s=step_s,
                  bytes=1024, samples_per_s=share * BATCH / compute_s)
    if loss is not None:
        fields["loss"] = loss
    _write(journal, "rank_step", at, **fields)


def _loss(step: int) -> float:
    return 4.0 - 0.1 * step


def make_run(run_dir: Path, *, with_steps: bool = True, with_events: bool = True) -> Path:
    """Two ranks over 30 steps; step 12 is redone (its first records are void), the
    shares change at step 15; a membership event (written by both ranks) and a note."""
    ranks = [Journal(run_dir / "ranks" / f"rank-{100 + rank}.jsonl") for rank in (0, 1)]
    metrics = Journal(run_dir / "metrics.jsonl")
    for step in range(STEPS):
        at = T0 + step
        if step == REDONE:  # the first try: its collectives failed, it is trained again
            for rank, journal in enumerate(ranks):
                _rank_step(journal, rank, step, at, compute_s=9.9, loss=99.0)
            if with_steps:
                _write(metrics, "step", at, step=step, loss=99.0, samples_per_s=1.0,
                       generation=0, workers=2)
            at += 0.5
        for rank, journal in enumerate(ranks):
            _rank_step(journal, rank, step, at, compute_s=0.1 * (rank + 1),
                       loss=_loss(step) + rank, step_s=0.2 + 0.05 * rank)
        if with_steps:
            _write(metrics, "step", at, step=step, loss=_loss(step),
                   samples_per_s=100.0 + step, generation=int(step >= REDONE), workers=2,
                   shares=[8, 8])
    if with_events:
        for rank, recovery in ((0, 0.3), (1, 0.4)):  # every member records the change
            _write(ranks[rank], "event", T0 + REDONE + 0.2, generation=1,
                   cause="a collective of the step failed", left=["host:7"], joined=[],
                   world_size=2, recovery_s=recovery)
        _write(metrics, "event", T0 + CHANGE + 0.1, what="rebalance", step=CHANGE,
               text="shares 8/8 -> 10/6")
    for journal in [*ranks, metrics]:
        journal.close()
    return run_dir


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(PNG), f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.timeout(60)
def test_series_keep_the_last_record_of_a_redone_step(tmp_path: Path) -> None:
    series = load_run(make_run(tmp_path / "run"))
    assert series.start == T0
    assert series.loss.x == tuple(range(STEPS))
    assert series.loss.y == pytest.approx([_loss(step) for step in range(STEPS)])
    assert series.throughput.y == pytest.approx([100.0 + step for step in range(STEPS)])
    assert [r.rank for r in series.ranks] == [0, 1]
    zero, one = series.ranks
    assert zero.compute_s.y == pytest.approx([0.1] * STEPS)  # not the void 9.9
    assert one.compute_s.y == pytest.approx([0.2] * STEPS)
    assert zero.wait_s.y == pytest.approx([0.1] * STEPS)
    assert one.wait_s.x == tuple(range(STEPS)) and set(one.wait_s.y) == {0.0}
    # rank_step shares win over the step records' equal [8, 8]
    assert zero.share.y[CHANGE - 1 : CHANGE + 1] == (0.5, 0.625)
    assert one.share.y[CHANGE - 1 : CHANGE + 1] == (0.5, 0.375)
    assert series.progress.y == tuple(range(STEPS))
    assert series.progress.x[REDONE] == pytest.approx(REDONE + 0.5)


@pytest.mark.timeout(60)
def test_events_one_per_generation_and_each_note(tmp_path: Path) -> None:
    change, note = load_run(make_run(tmp_path / "run")).events
    assert change.label == "generation 1"
    assert change.step == REDONE - 1  # the last step committed before it
    assert change.time == T0 + REDONE + 0.2
    assert "a collective of the step failed" in change.text
    assert "left: host:7" in change.text and "recovery 0.40 s" in change.text  # the slowest
    assert (note.label, note.step, note.text) == ("rebalance", CHANGE, "shares 8/8 -> 10/6")


@pytest.mark.timeout(60)
def test_without_step_records_the_ranks_give_loss_and_throughput(tmp_path: Path) -> None:
    series = load_run(make_run(tmp_path / "run", with_steps=False))
    assert series.loss.y == pytest.approx([_loss(step) for step in range(STEPS)])  # rank 0
    # every rank's samples over the slowest rank's step_s (0.25 s)
    assert series.throughput.y == pytest.approx([BATCH / 0.25] * STEPS)
    assert series.ranks[0].share.y[CHANGE] == 0.625


@pytest.mark.timeout(60)
def test_only_the_run_dir_and_its_ranks_dir_are_read(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "run")
    with Journal(run_dir / "records" / "worker-0.jsonl") as deeper, \
            Journal(run_dir / "metrics-1-worker.jsonl") as baseline:
        deeper.write("step", at=T0 + 99, step=0, loss=50.0)
        baseline.write("step", at=T0 + 99, step=1, loss=60.0)  # the demo's 1-worker phase
    series = load_run(run_dir)
    assert series.loss.y[:2] == pytest.approx([_loss(0), _loss(1)])


@pytest.mark.timeout(60)
def test_write_plots_writes_every_png(tmp_path: Path) -> None:
    series = load_run(make_run(tmp_path / "run"))
    written = write_plots(series, tmp_path / "out")
    names = ["loss.png", "throughput.png", "compute_wait.png", "shares.png", "events.png"]
    assert [path.name for path in written] == names
    for path in written:
        assert path.parent == tmp_path / "out"
        assert path.stat().st_size > 5_000, path
        width, height = _png_size(path)
        assert 600 <= width <= 1600 and 300 <= height <= 1000, (path, width, height)


@pytest.mark.timeout(60)
def test_a_plot_without_data_is_skipped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with Journal(run_dir / "ranks" / "rank-1.jsonl") as journal:
        for step in range(5):
            _write(journal, "rank_step", T0 + step, rank=0, step=step, samples=8, share=1.0,
                   compute_s=0.1, wait_s=0.0, step_s=0.1)
    series = load_run(run_dir)
    written = write_plots(series, tmp_path / "out")
    assert [path.name for path in written] == ["throughput.png", "compute_wait.png",
                                              "shares.png", "events.png"]  # no loss
    assert series.events == ()  # events.png says "no events (...)"
    assert _png_size(written[-1]) == (800, 450)


@pytest.mark.timeout(60)
def test_an_empty_or_missing_run_dir_says_how_to_make_one(tmp_path: Path) -> None:
    (tmp_path / "empty" / "ranks").mkdir(parents=True)
    (tmp_path / "empty" / "ranks" / "rank-1.jsonl").touch()
    with pytest.raises(ConfigError, match=r"no journal records in .*ranks/\*\.jsonl.*"
                                          r"potluck demo"):
        load_run(tmp_path / "empty")
    with pytest.raises(ConfigError, match="does not exist"):
        load_run(tmp_path / "missing")


@pytest.mark.timeout(60)
def test_cli_prints_each_png_written(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = make_run(tmp_path / "run")
    assert cli.main(["plot", str(run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5
    for line in lines:
        path = Path(line.split()[1])
        assert line.startswith("wrote ") and "KiB" in line
        assert path.parent == run_dir / "plots" and path.read_bytes().startswith(PNG)
    assert cli.main(["plot", str(run_dir), "--out", str(tmp_path / "elsewhere")]) == 0
    assert len(list((tmp_path / "elsewhere").glob("*.png"))) == 5


@pytest.mark.timeout(60)
def test_cli_empty_run_dir_is_an_error_without_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert cli.main(["plot", str(tmp_path / "empty")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("potluck plot: error: no journal records in ")
    assert "Traceback" not in captured.err
    assert cli.main(["plot", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
