"""The journal: one record shape, whole lines under concurrent appends and kills."""

from __future__ import annotations

import json
import math
import multiprocessing
from pathlib import Path

import pytest

from potluck.metrics.journal import Journal, JournalFollower, make_record, read_journal

WRITERS, RECORDS, PAD = 4, 150, 6000  # lines longer than a pipe buffer (4 KiB)


@pytest.mark.timeout(30)
def test_round_trip_carries_kind_time_pid_and_fields(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "run.jsonl"  # the directory is created
    with Journal(path) as journal:
        written = journal.write("step", step=0, loss=4.5, generation=0, workers=2)
        journal.write("step", step=1, loss=math.nan, generation=0, workers=2)
        journal.write("kill", target=42, at=12.5)
    first, second, kill = read_journal(path)
    assert first == written
    assert list(first)[:3] == ["kind", "time", "pid"]
    assert first["kind"] == "step" and first["pid"] == journal.pid and first["time"] > 1e9
    assert (first["step"], first["loss"], first["workers"]) == (0, 4.5, 2)
    assert second["loss"] is None  # non-finite floats are null: valid JSON
    assert kill["time"] == 12.5 and kill["target"] == 42
    assert all(json.loads(line) for line in path.read_text().splitlines())


@pytest.mark.timeout(30)
def test_appends_unless_truncated_and_reads_files_in_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for kind in ("hello", "done"):
        with Journal(a) as journal:
            journal.write(kind, steps=1)
    with Journal(b) as journal:
        journal.write("redo", step=3)
    assert [r["kind"] for r in read_journal([a, tmp_path / "missing.jsonl", b])] == [
        "hello", "done", "redo"]
    with Journal(a, truncate=True) as journal:
        journal.write("member", rank=0)
    assert [r["kind"] for r in read_journal(a)] == ["member"]


@pytest.mark.timeout(30)
def test_torn_final_line_is_skipped_and_a_bad_complete_line_is_an_error(
        tmp_path: Path) -> None:
    path = tmp_path / "worker.jsonl"
    with Journal(path) as journal:
        journal.write("step", step=0)
    with path.open("a") as file:  # what a SIGKILL in the middle of a write would leave
        file.write('{"kind": "step", "time": 1.0, "pid": 7, "st')
    assert [r["step"] for r in read_journal(path)] == [0]
    with path.open("a") as file:
        file.write("\n")
    with pytest.raises(ValueError, match="is not a JSON record"):
        read_journal(path)


@pytest.mark.timeout(30)
def test_bad_kinds_and_reserved_fields_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'commit' is not one of hello, member"):
        make_record("commit", {}, pid=1, at=0.0)
    with pytest.raises(ValueError, match=r"\['pid'\] are set by the journal"):
        make_record("kill", {"pid": 3}, pid=1, at=0.0)
    journal = Journal(tmp_path / "closed.jsonl")
    journal.close()
    with pytest.raises(ValueError, match="is closed"):
        journal.write("done", steps=0)


def _append_many(path: str, writer: int) -> None:
    with Journal(path) as journal:
        for index in range(RECORDS):
            journal.write("step", step=index, writer=writer, pad="x" * PAD)


@pytest.mark.timeout(60)
def test_concurrent_writers_never_tear_or_interleave_a_line(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl"
    context = multiprocessing.get_context("fork")  # no torch import per writer
    procs = [context.Process(target=_append_many, args=(str(path), w)) for w in range(WRITERS)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=50)
        assert proc.exitcode == 0
    records = read_journal(path)  # raises on any torn or interleaved line
    assert len(records) == WRITERS * RECORDS == len(path.read_bytes().splitlines())
    assert len({r["pid"] for r in records}) == WRITERS
    for writer in range(WRITERS):
        mine = [r for r in records if r["writer"] == writer]
        assert [r["step"] for r in mine] == list(range(RECORDS))  # each in its order
        assert all(r["pad"] == "x" * PAD for r in mine)


@pytest.mark.timeout(30)
def test_follower_returns_only_complete_new_lines(tmp_path: Path) -> None:
    follower = JournalFollower(tmp_path)
    path = tmp_path / "worker-0-1.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n" + '{"b": ')
    assert follower.poll() == [{"a": 1}]
    with path.open("a") as file:
        file.write('2}\n')
    assert follower.poll() == [{"b": 2}]
    assert follower.poll() == []
