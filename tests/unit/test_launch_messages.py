"""What ``potluck run`` says when something is off: a typo'd flag, a short token, a wait
for node 0, a refusal raised by every rank, flags a script never used."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

import potluck
import potluck.cli as potluck_cli
from potluck.env import WorkerEnv
from potluck.errors import CommHookError, ConfigError, PeerLostError, RendezvousError
from potluck.launch import cli, meeting, store, worker
from potluck.launch.config import LaunchConfig
from potluck.launch.report import (
    ErrorRecord,
    WorkerResult,
    brief_error,
    format_report,
    rank_ranges,
    read_error_file,
    write_error_file,
)
from potluck.metrics import plot_cli
from potluck.testing import free_port

# ------------------------------------------------------------------ a typo'd flag


def _run_flags() -> list[str]:
    parser = argparse.ArgumentParser(prog="potluck run")
    cli.add_arguments(parser)
    return potluck_cli.visible_flags(parser)


@pytest.mark.parametrize(("typed", "meant"), [
    ("--nproc-per-nod", "--nproc-per-node"),
    ("--nproc_per_nod", "--nproc_per_node"),  # torchrun's spelling, answered in kind
    ("--nproc-per-nod=2", "--nproc-per-node"),
    ("--nproc", "--nproc-per-node"),  # run takes no abbreviation: named instead
    ("--elastc", "--elastic"),
    ("--max-restart", "--max-restarts"),
    ("--zzz", None),
    ("-n", None),  # a short option: no long flag is near it (difflib said --token)
    ("--n", None),
])
def test_a_typod_flag_gets_the_closest_known_one(typed: str, meant: str | None) -> None:
    assert potluck_cli.did_you_mean(typed, _run_flags()) == meant


def test_potluck_run_names_the_unknown_flag_and_the_one_meant(
        capsys: pytest.CaptureFixture[str]) -> None:
    # argparse would take "2" for the script and say only "unrecognized arguments"
    assert potluck_cli.main(["run", "--nproc-per-nod", "2", "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("potluck run: unknown flag --nproc-per-nod: did you mean "
                           "--nproc-per-node? (see potluck run --help; the script's own "
                           "flags go after its path)")
    assert potluck_cli.main(["demo", "--worker", "3"]) == 2
    assert "potluck demo: unknown flag --worker: did you mean --workers?" in \
        capsys.readouterr().err


# ------------------------------------------------------------------ a short token


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_token_shorter_than_8_characters_is_refused_with_how_to_make_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="is 1 character") as refused:
        cli.require_token(cli.config_from_args(_parse("--elastic", "--token", "x", "t.py")))
    message = str(refused.value)
    assert "at least 8" in message and "secrets.token_hex(16)" in message
    assert cli.main(_parse("--elastic", "--token", "s3cret7", __file__)) == 2
    err = capsys.readouterr().err
    assert "is 7 character(s) long: it must be at least 8" in err
    assert "s3cret7" not in err  # never echoed
    config = cli.require_token(cli.config_from_args(_parse("--elastic", "--token",
                                                           "8chars!!", "t.py")))
    assert config.token == "8chars!!"


# ------------------------------------------------------------------ waiting for node 0


def test_a_wait_reports_after_5_s_then_every_10_s() -> None:
    due = [meeting.report_due(w, said) for w, said in
           ((4.9, 0), (5.0, 0), (14.9, 1), (15.0, 1), (25.0, 2), (24.0, 2))]
    assert due == [False, True, False, True, True, False]


def test_the_waiting_lines_say_what_for_where_and_the_fix() -> None:
    line = store.waiting_for_store(1, "10.0.0.9:29500", 15.2, 300.0, "Connection refused")
    assert line == ("potluck run: node 1 is waiting for node 0's store at 10.0.0.9:29500 "
                    "(15 s of --join-timeout 300 s; last try: Connection refused): start "
                    "node 0's `potluck run` if it is not running, and check --master-addr "
                    "and --master-port (node 0's address and port as this node sees them); "
                    "if node 0 was lost mid-run, the store moved: every running node "
                    "printed where ('it moved to node N at HOST:PORT'), and those are this "
                    "node's --master-addr and --master-port")
    line = meeting.waiting_for_nodes(0, 1, 2, 25.0, 300.0)
    assert "node 0 is waiting for the other nodes: 1 of 2 node agents" in line
    assert "(25 s of --join-timeout 300 s)" in line and "--run-id" in line


@pytest.mark.timeout(30)
def test_a_node_that_cannot_reach_node_0_says_so_while_it_waits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meeting, "FIRST_REPORT", 0.2)
    monkeypatch.setattr(meeting, "REPORT_EVERY", 0.5)
    port = free_port()  # nothing listens there
    config = LaunchConfig(script="x.py", nnodes=2, node_rank=1, master_port=port,
                          join_timeout=1.5)
    said: list[tuple[float, str]] = []
    started = time.monotonic()
    with pytest.raises(RendezvousError, match="could not reach the store"):
        store.join_store(config, stopping=lambda: False,
                         say=lambda line: said.append((time.monotonic() - started, line)))
    assert said, "a node waiting for node 0 said nothing"
    assert said[0][0] < 1.5  # while it waited, not at the end
    assert all(f"waiting for node 0's store at 127.0.0.1:{port}" in line
               and "--master-addr" in line for _, line in said)


class _CountingStore:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, key: str, value: int) -> int:
        self.counts[key] = self.counts.get(key, 0) + value
        return self.counts[key]


@pytest.mark.timeout(30)
def test_an_agent_waiting_for_the_other_nodes_says_how_many_came(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meeting, "FIRST_REPORT", 0.1)
    said: list[str] = []
    with pytest.raises(RendezvousError, match="only 1 of 2 node agents"):
        meeting.meet(_CountingStore(), "k", 2, 0.6, lambda: False,  # type: ignore[arg-type]
                   say=said.append, node_rank=0)
    assert said and "node 0 is waiting for the other nodes: 1 of 2" in said[0]


# ------------------------------------------------------------------ one refusal, every rank


def _raised(rank: int, code: int, error: ErrorRecord | None, *,
            stopped: bool = False) -> WorkerResult:
    return WorkerResult(rank, rank, 100 + rank, code, 1.0 + rank / 10, stopped, error)


def _record(exc: BaseException, at: float) -> ErrorRecord:
    return ErrorRecord(at, type(exc).__name__, str(exc), "Traceback...\n  deep frames\n",
                       brief_error(exc))


def test_ranks_are_written_in_runs() -> None:
    assert rank_ranges([2]) == "rank 2"
    assert rank_ranges([3, 0, 1, 2]) == "ranks 0-3"
    assert rank_ranges([0, 1, 3]) == "ranks 0-1, 3"
    assert rank_ranges([0, 2, 4, 5]) == "ranks 0, 2, 4-5"


def test_potlucks_own_errors_are_brief_other_exceptions_keep_their_traceback() -> None:
    assert brief_error(ConfigError("bad")) and brief_error(RendezvousError("gone"))
    assert brief_error(PeerLostError.from_failure("allreduce", "reset", rank=0,
                                                  generation=0))
    assert not brief_error(ValueError("bug"))
    assert not brief_error(CommHookError("the hook failed: its cause is the user's code"))


def test_a_refusal_raised_by_every_rank_is_one_line_naming_the_ranks() -> None:
    refusal = ConfigError("global_batch=0 must be a positive int, e.g. global_batch=64")
    results = [_raised(r, 1 if r != 3 else -15, _record(refusal, 0.5 + r / 10),
                       stopped=r == 3) for r in range(4)]
    text = format_report(results, host="vm", node_rank=0)
    assert text == ("potluck run: the job failed: ConfigError: global_batch=0 must be a "
                    "positive int, e.g. global_batch=64 (ranks 0-3 on host vm, node rank 0)")
    # a rank stopped before it raised is listed once, apart
    results[3] = _raised(3, -15, None, stopped=True)
    lines = format_report(results, host="vm", node_rank=0).splitlines()
    assert lines[0].endswith("(ranks 0-2 on host vm, node rank 0)")
    assert lines[1:] == ["Other workers:", "  rank 3 (pid 103): stopped by the launcher"]


def test_another_exception_raised_by_every_rank_keeps_one_traceback() -> None:
    bug = ValueError("rank exploded")
    results = [_raised(r, 1, _record(bug, 0.5 + r / 10)) for r in range(4)]
    results.append(_raised(4, -15, None, stopped=True))
    text = format_report(results, host="vm", node_rank=0)
    assert text.count("deep frames") == 1 and text.count("rank exploded") == 1
    assert "rank      : 0 (local rank 0, node rank 0)" in text
    assert "  ranks 1-3 (pids 101, 102, 103): exit code 1: the same ValueError" in text
    assert "  rank 4 (pid 104): stopped by the launcher" in text


def test_the_error_file_keeps_whether_the_error_is_brief(tmp_path: Path) -> None:
    path = str(tmp_path / "error.json")
    write_error_file(path, ConfigError("bad value"))
    record = read_error_file(path)
    assert record is not None and record.brief
    assert (record.exc_type, record.message) == ("ConfigError", "bad value")
    write_error_file(path, KeyError("k"))
    record = read_error_file(path)
    assert record is not None and not record.brief


# ------------------------------------------------------------------ flags without prepare


def test_the_flags_only_prepare_reads_are_named_with_what_they_do_not_do() -> None:
    flags = worker.prepare_flags(WorkerEnv(status=True, metrics_dir="runs/m", balance=True))
    assert flags == ["--status-port", "--metrics-dir", "--balance"]
    assert worker.prepare_flags(WorkerEnv()) == []
    line = worker.unused_flags_line(flags, "runs/m")
    assert line.startswith("potluck: --status-port, --metrics-dir and --balance take effect "
                           "only in potluck.prepare(...), which this script did not call: ")
    assert "the status page shows no worker" in line and "written to runs/m" in line
    assert "equal share" in line and line.endswith("or drop them")
    once = worker.unused_flags_line(["--balance"], None, after=60.0)
    assert "--balance takes effect" in once and "has not called in its first 60 s" in once
    assert once.endswith("or drop it")


@pytest.mark.timeout(30)
def test_the_unused_flags_are_said_once_after_a_while_or_at_the_end() -> None:
    said: list[str] = []
    watch = worker.UnusedFlags(["--balance"], None, prepared=lambda: False,
                               say=said.append, after=0.05).start()
    deadline = time.monotonic() + 10
    while not said and time.monotonic() < deadline:
        time.sleep(0.01)
    watch.finished()
    assert said == [worker.unused_flags_line(["--balance"], None, after=0.05)]
    ended: list[str] = []
    worker.UnusedFlags(["--balance"], None, prepared=lambda: False, say=ended.append,
                       after=60.0).start().finished()
    assert ended == [worker.unused_flags_line(["--balance"], None)]
    quiet: list[str] = []
    worker.UnusedFlags(["--balance"], None, prepared=lambda: True, say=quiet.append,
                       after=0.01).start().finished()
    assert quiet == []


@pytest.mark.timeout(60)
def test_a_script_that_calls_prepare_is_seen_as_prepared() -> None:
    net = torch.nn.Linear(1, 1)
    data = TensorDataset(torch.zeros(8, 1), torch.zeros(8, 1))
    _, opt, _ = potluck.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), data,
                                global_batch=4)
    try:
        said: list[str] = []
        worker.UnusedFlags(["--metrics-dir"], "m", prepared=worker._prepared,
                           say=said.append).start().finished()
        assert said == []
    finally:
        opt.cohort.close()  # (no cohort left current for the next test)


def test_plot_on_a_metrics_dir_without_records_says_what_it_holds_and_what_writes_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank-7.jsonl").touch()
    args = argparse.Namespace(run_dir=tmp_path, out=None)
    assert plot_cli.main(args) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} holds ranks/, ranks/rank-7.jsonl (empty)" in err
    assert "potluck.prepare(...)" in err and f"--metrics-dir {tmp_path}" in err
    assert "potluck demo" not in err
    (tmp_path / "ranks" / "rank-7.jsonl").unlink()
    (tmp_path / "ranks").rmdir()
    assert plot_cli.main(args) == 2
    assert f"{tmp_path} is empty" in capsys.readouterr().err

