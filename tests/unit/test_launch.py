"""The launcher's pure parts: worker environment, restart policy, report, flags."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

import pytest

from potluck.env import finished_file, read_worker_env
from potluck.errors import ConfigError
from potluck.launch import cli
from potluck.launch.config import LaunchConfig, worker_environ
from potluck.launch.policy import Action, Outcome, next_action
from potluck.launch.report import (
    ErrorRecord,
    WorkerResult,
    format_report,
    format_teardown_warning,
    read_error_file,
    read_finished_file,
    root_cause,
    write_error_file,
    write_finished_file,
)


def _environ(config: LaunchConfig, local_rank: int, **base: str) -> dict[str, str]:
    return worker_environ(
        config, local_rank=local_rank, master_port=1234, restart_count=1, base=base,
        error_file="/tmp/e.json", agent_pid=42,
    )


def test_worker_environ_follows_torchrun_and_reads_back() -> None:
    config = LaunchConfig("train.py", nproc_per_node=2, nnodes=3, node_rank=1,
                          master_addr="10.1.1.1", run_id="r9")
    environ = _environ(config, 1, PATH="/bin")
    assert environ["PATH"] == "/bin"
    assert environ["RANK"] == "3" and environ["GROUP_RANK"] == "1"
    assert environ["ROLE_RANK"] == "3" and environ["ROLE_WORLD_SIZE"] == "6"
    assert environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert environ["OMP_NUM_THREADS"] == "1"
    env = read_worker_env(environ)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 6, 1, 2)
    assert (env.master_addr, env.master_port, env.restart_count) == ("10.1.1.1", 1234, 1)
    assert env.agent_store and env.run_id == "r9"


def test_worker_environ_keeps_the_users_thread_count() -> None:
    config = LaunchConfig("t.py", nproc_per_node=2)
    assert _environ(config, 0, OMP_NUM_THREADS="4")["OMP_NUM_THREADS"] == "4"
    assert "OMP_NUM_THREADS" not in _environ(LaunchConfig("t.py"), 0)


@pytest.mark.parametrize(
    ("outcome", "done", "most", "action"),
    [
        (Outcome.SUCCEEDED, 0, 0, Action.FINISH),
        (Outcome.FAILED, 0, 0, Action.GIVE_UP),
        (Outcome.FAILED, 0, 2, Action.RESTART),
        (Outcome.FAILED, 2, 2, Action.GIVE_UP),
        (Outcome.INTERRUPTED, 0, 5, Action.GIVE_UP),
    ],
)
def test_next_action(outcome: Outcome, done: int, most: int, action: Action) -> None:
    assert next_action(outcome, done, most) is action


def _result(rank: int, code: int, seen: float, *, stopped: bool = False,
            raised_at: float | None = None) -> WorkerResult:
    error = None if raised_at is None else ErrorRecord(raised_at, "ValueError", "boom",
                                                       "Traceback...\nValueError: boom\n")
    return WorkerResult(rank, rank, 100 + rank, code, seen, stopped, error)


def test_root_cause_is_the_earliest_recorded_failure_never_a_stopped_worker() -> None:
    results = [
        _result(0, 1, seen=10.0, raised_at=9.5),  # a consequence, seen first
        _result(1, 1, seen=10.1, raised_at=9.0),  # raised first: the root cause
        _result(2, -15, seen=10.2, stopped=True),
    ]
    root = root_cause(results)
    assert root is not None and root.rank == 1
    assert root_cause([_result(0, 0, 1.0), _result(1, -15, 1.0, stopped=True)]) is None
    assert root_cause([_result(0, -9, 5.0), _result(1, 1, 4.0)]) == _result(1, 1, 4.0)


def _lost_peer(rank: int, raised_at: float) -> WorkerResult:
    error = ErrorRecord(raised_at, "PeerLostError", "a peer died", "Traceback...\n")
    return WorkerResult(rank, rank, 100 + rank, 1, raised_at + 0.1, error=error)


def test_a_failure_of_its_own_is_the_root_cause_before_a_lost_peer() -> None:
    # rank 1 died without raising (seen a little after rank 0 lost it as a peer)
    results = [_lost_peer(0, raised_at=5.0), _result(1, -11, seen=5.05)]
    root = root_cause(results)
    assert root is not None and root.rank == 1


def test_gloos_connection_closed_by_peer_is_a_lost_peer_not_the_root_cause() -> None:
    """A plain torch script's survivor of a kill -9 raises Gloo's RuntimeError; the
    killed worker (no exception recorded) is the root cause."""
    message = ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
               "peer [127.0.0.1]:41234")
    survivor = WorkerResult(0, 0, 100, 1, 5.1,
                            error=ErrorRecord(5.0, "RuntimeError", message, "Traceback...\n"))
    killed = _result(1, -9, seen=5.05)
    root = root_cause([survivor, killed])
    assert root is not None and root.rank == 1
    own = WorkerResult(0, 0, 100, 1, 5.1,
                       error=ErrorRecord(5.0, "RuntimeError", "shape mismatch", "T...\n"))
    assert root_cause([own, killed]) == own  # any other RuntimeError is its own


def test_a_rank_whose_script_ended_while_the_others_needed_it_is_the_root_cause() -> None:
    leaver = WorkerResult(1, 1, 101, 0, seen_at=5.2, finished_at=4.9)
    results = [_lost_peer(0, raised_at=5.0), leaver]
    assert root_cause(results) == leaver
    text = format_report(results, host="node-a", node_rank=0)
    assert "rank      : 1 (local rank 1, node rank 0)" in text
    assert "its script ended while the other ranks still waited for it" in text
    assert "rank 0 (pid 100): exit code 1: PeerLostError" in text
    # stopped by the agent in its teardown: it had left all the same
    stopped = WorkerResult(1, 1, 101, -15, seen_at=5.2, stopped=True, finished_at=4.9)
    assert root_cause([_lost_peer(0, raised_at=5.0), stopped]) == stopped
    # a script that ended after the agent saw the loss is not why it happened
    late = WorkerResult(1, 1, 101, 0, seen_at=5.2, finished_at=5.15)
    assert root_cause([_lost_peer(0, raised_at=5.0), late]) == _lost_peer(0, 5.0)


def test_a_rank_that_closed_its_cohort_and_left_is_the_root_cause() -> None:
    """``cohort.close()`` closes the group before the script ends: the peer records its
    loss (5.0) before the leaver's finished record (5.01), and exits later (5.1)."""
    closed = WorkerResult(1, 1, 101, 0, seen_at=5.12, finished_at=5.01)
    results = [_lost_peer(0, raised_at=5.0), closed]
    assert root_cause(results) == closed
    text = format_report(results, host="h", node_rank=0)
    assert "rank      : 1 (local rank 1, node rank 0)" in text
    assert "its script ended while the other ranks still waited for it" in text


def _stopped_after_raising(rank: int, raised_at: float) -> WorkerResult:
    error = ErrorRecord(raised_at, "CursorError", "the cursor is past the end",
                        "Traceback...\nCursorError: the cursor is past the end\n")
    return WorkerResult(rank, rank, 100 + rank, -15, raised_at + 0.5, stopped=True,
                        error=error)


def test_a_worker_stopped_after_it_raised_its_own_error_is_the_root_cause() -> None:
    """Rank 1 raised first; rank 0 lost it as a peer and its exit was seen first, so
    the agent stopped rank 1 while its traceback printed."""
    raiser = _stopped_after_raising(1, raised_at=4.9)
    results = [_lost_peer(0, raised_at=5.0), raiser]
    assert root_cause(results) == raiser
    text = format_report(results, host="h", node_rank=0)
    root = text.split("Root cause")[1].split("Other workers")[0]
    assert "rank      : 1 (local rank 1, node rank 0)" in root
    assert "CursorError: the cursor is past the end" in root
    assert "stopped   : by the launcher, after it raised the error below" in root
    assert "rank 0 (pid 100): exit code 1: PeerLostError" in text
    # a failure of its own that was only seen (no record) still wins if it came first
    killed = _result(2, -9, seen=4.8)
    assert root_cause([*results, killed]) == killed
    # raised after the agent saw the first failure (while being stopped): a consequence
    later = _stopped_after_raising(1, raised_at=5.2)
    assert root_cause([_lost_peer(0, raised_at=5.0), later]) == _lost_peer(0, 5.0)


def test_format_report_names_rank_host_exit_and_traceback() -> None:
    text = format_report(
        [_result(0, -15, 2.0, stopped=True), _result(1, 1, 1.0, raised_at=1.0),
         _result(2, -9, 1.5)],
        host="node-a", node_rank=0,
    )
    assert "rank      : 1 (local rank 1, node rank 0)" in text
    assert "host      : node-a" in text and "pid       : 101" in text
    assert "ValueError: boom" in text and "Traceback..." in text
    assert "rank 0 (pid 100): stopped by the launcher" in text
    assert "rank 2 (pid 102): killed by SIGKILL" in text
    dead = format_report([_result(0, -int(signal.SIGSEGV), 1.0)], host="h", node_rank=0)
    assert "SIGSEGV" in dead and "none recorded" in dead


def test_a_worker_that_finished_then_died_at_exit_is_no_failure_but_is_named() -> None:
    aborted = WorkerResult(1, 1, 101, -int(signal.SIGABRT), 2.0, finished_at=1.5)
    assert aborted.died_after_finishing and not aborted.failed
    assert root_cause([_result(0, 0, 1.0), aborted]) is None
    warning = format_teardown_warning(aborted, host="node-a", node_rank=0)
    assert "rank 1 (local rank 1, node rank 0, host node-a, pid 101)" in warning
    assert "finished its script, then died at interpreter exit" in warning
    assert "killed by SIGABRT (exit code -6)" in warning and "not restarted" in warning
    report = format_report([_result(0, 1, 1.0, raised_at=1.0), aborted], host="h",
                           node_rank=0)
    assert "rank      : 0 (local rank 0" in report  # the real failure stays the root cause
    assert "rank 1 (pid 101): finished its script, then killed by SIGABRT (exit code -6) " \
        "at interpreter exit" in report
    unfinished = WorkerResult(1, 1, 101, -int(signal.SIGABRT), 2.0)
    assert unfinished.failed and not unfinished.died_after_finishing


def test_finished_file_reaches_the_worker_and_round_trips(tmp_path: Path) -> None:
    environ = worker_environ(LaunchConfig("t.py"), local_rank=0, master_port=1, restart_count=0,
                             base={}, error_file="e.json", agent_pid=1,
                             finished_file=str(tmp_path / "finished-0"))
    path = finished_file(environ)
    assert path == str(tmp_path / "finished-0")
    assert read_finished_file(path) is None
    write_finished_file(path)
    assert read_finished_file(path) is not None
    assert finished_file(_environ(LaunchConfig("t.py"), 0)) is None


def test_error_file_round_trip(tmp_path: Path) -> None:
    path = str(tmp_path / "err.json")
    try:
        raise KeyError("missing")
    except KeyError as exc:
        write_error_file(path, exc)
    record = read_error_file(path)
    assert record is not None and record.exc_type == "KeyError"
    assert "raise KeyError" in record.traceback
    assert read_error_file(str(tmp_path / "absent.json")) is None


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_take_torchrun_spellings_and_pass_script_args_through() -> None:
    args = _parse("--nproc_per_node", "3", "--nnodes=2:2", "--node-rank", "1",
                  "--rdzv-endpoint", "10.0.0.5:4000", "--max_restarts", "2",
                  "train.py", "--lr", "0.1", "--nproc-per-node", "7")
    config = cli.config_from_args(args)
    assert (config.nproc_per_node, config.nnodes, config.node_rank) == (3, 2, 1)
    assert (config.master_addr, config.master_port, config.max_restarts) == ("10.0.0.5", 4000, 2)
    assert config.script == "train.py"
    assert config.script_args == ("--lr", "0.1", "--nproc-per-node", "7")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--node-rank", "2", "--nnodes", "2", "t.py"), "--node-rank 2 with --nnodes 2"),
        (("--nproc-per-node", "0", "t.py"), "--nproc-per-node 0 must be at least 1"),
        (("--nproc-per-node", "many", "t.py"), "neither a number nor auto"),
        (("--nnodes", "1:4", "t.py"), "needs --elastic"),
        (("--nnodes", "3:2", "--elastic", "t.py"), "MIN must not exceed MAX"),
        (("--nnodes", "0:2", "--elastic", "t.py"), "MIN must be between 1 and MAX"),
        (("--nnodes", "two", "t.py"), "neither a count nor MIN:MAX"),
        (("--min-workers", "2", "t.py"), "only applies to --elastic"),
        (("--min-workers", "0", "--elastic", "t.py"), "--min-workers 0 must be at least 1"),
        (("--min-workers", "5", "--elastic", "--nproc-per-node", "2", "t.py"),
         "more than the job can ever have"),
        (("--min-workers-timeout", "0", "--elastic", "t.py"), "positive number of seconds"),
        (("--master-port", "99999", "t.py"), "not a TCP port"),
        (("--rdzv-endpoint", "host:port", "t.py"), "HOST:PORT"),
        (("--rdzv-endpoint", "[fd00::1:29500", "t.py"), "HOST:PORT"),
        (("--rdzv-endpoint", "[fd00::1]29500", "t.py"), "HOST:PORT"),
        (("--nproc-per-node", "-1", "t.py"), "--nproc-per-node -1 must be at least 1"),
        (("--rdzv-backend", "etcd-v2", "t.py"),
         "--rdzv-backend 'etcd-v2'.*use --rdzv-backend c10d.*or --rdzv-backend etcd"),
        (("--rdzv-backend", "etcd", "--elastic", "t.py"),
         "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT"),
        (("--rdzv-backend", "etcd", "--rdzv-endpoint", "e:2379", "t.py"), "add --elastic"),
        (("--rdzv-backend", "etcd", "--rdzv-endpoint", "e:2379", "--elastic",
          "--status-port", "0", "t.py"), "status page reads node 0's own store"),
        (("--rdzv-backend", "etcd", "--rdzv-endpoint", "e:port", "--elastic", "t.py"),
         "HOST:PORT"),
        (("--monitor-interval", "0", "t.py"), "--monitor-interval 0 must be a positive"),
        (("--local-ranks-filter", "0,x", "t.py"), "local ranks separated by commas"),
        (("--local-ranks-filter", "2", "--nproc-per-node", "2", "t.py"),
         r"local rank\(s\) \[2\], but this node runs 2 worker\(s\): use 0..1"),
    ],
)
def test_bad_flags_name_the_value(argv: tuple[str, ...], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        cli.config_from_args(_parse(*argv))


def test_elastic_range_and_minimum_reach_the_workers() -> None:
    args = _parse("--nnodes", "1:3", "--nproc-per-node", "2", "--elastic", "--token", "t",
                  "--min-workers", "3", "--min-workers-timeout", "7.5", "t.py")
    config = cli.config_from_args(args)
    assert (config.min_nodes, config.nnodes, config.founders) == (1, 3, 2)
    environ = worker_environ(config, local_rank=1, master_port=5000, restart_count=0,
                             base={}, error_file="e.json", agent_pid=1)
    assert (environ["POTLUCK_FOUNDERS"], environ["POTLUCK_MIN_WORKERS"],
            environ["POTLUCK_MIN_WORKERS_TIMEOUT"]) == ("2", "3", "7.5")
    worker = read_worker_env(environ)
    assert (worker.founders, worker.min_workers, worker.min_workers_timeout) == (2, 3, 7.5)
    fixed = cli.config_from_args(_parse("--nnodes", "2", "--elastic", "--token", "t", "t.py"))
    assert (fixed.min_nodes, fixed.founders) == (None, 2)


def test_balance_flag_reaches_the_workers() -> None:
    config = cli.config_from_args(_parse("--nproc-per-node", "2", "--balance", "t.py"))
    environ = worker_environ(config, local_rank=0, master_port=5000, restart_count=0,
                             base={}, error_file="e.json", agent_pid=1)
    assert environ["POTLUCK_BALANCE"] == "1" and read_worker_env(environ).balance
    plain = cli.config_from_args(_parse("--nproc-per-node", "2", "t.py"))
    environ = worker_environ(plain, local_rank=0, master_port=5000, restart_count=0,
                             base={}, error_file="e.json", agent_pid=1)
    assert "POTLUCK_BALANCE" not in environ and not read_worker_env(environ).balance


@pytest.mark.parametrize(("endpoint", "stored"), [
    ("etcd.example.org:2380", "etcd.example.org:2380"),
    ("etcd.example.org", "etcd.example.org:2379"),  # etcd's client port, not torchrun's
    ("http://10.0.0.7:2379/", "10.0.0.7:2379"),
    ("[fd00::1]:2381", "[fd00::1]:2381"),
    ("fd00::1", "[fd00::1]:2379"),
])
def test_etcd_backend_reaches_the_workers_and_hosts_nothing(endpoint: str,
                                                            stored: str) -> None:
    config = cli.config_from_args(_parse(
        "--nnodes", "2", "--elastic", "--token", "t", "--rdzv-backend", "etcd",
        "--rdzv-endpoint", endpoint, "t.py"))
    assert config.etcd == stored
    assert (config.master_addr, config.master_port) == ("127.0.0.1", None)  # not etcd's
    environ = worker_environ(config, local_rank=0, master_port=5000, restart_count=0,
                             base={}, error_file="e.json", agent_pid=1)
    assert environ["POTLUCK_ETCD"] == stored and read_worker_env(environ).etcd == stored
    plain = cli.config_from_args(_parse("--elastic", "--token", "t", "t.py"))
    environ = worker_environ(plain, local_rank=0, master_port=5000, restart_count=0,
                             base={}, error_file="e.json", agent_pid=1)
    assert plain.etcd is None and "POTLUCK_ETCD" not in environ
    assert read_worker_env(environ).etcd is None


def test_torchrun_multi_node_recipe_flags_are_accepted() -> None:
    """The flags of PyTorch's multi-node torchrun recipe, as users copy them."""
    config = cli.config_from_args(_parse(
        "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-id", "job7", "--rdzv-backend",
        "c10d", "--rdzv-endpoint", "10.0.0.5:29400", "--rdzv-conf", "join_timeout=900",
        "--monitor-interval", "1", "--log-dir", "logs", "--local-ranks-filter", "1,0,1",
        "--max-restarts", "3", "train.py"))
    assert (config.run_id, config.master_addr, config.master_port) == ("job7", "10.0.0.5",
                                                                       29400)
    assert (config.log_dir, config.local_ranks_filter) == ("logs", (0, 1))
    assert cli.config_from_args(_parse("t.py")).local_ranks_filter is None


def test_torchrun_flags_potluck_lacks_are_ignored_or_refused_with_what_to_do(
        capsys: pytest.CaptureFixture[str]) -> None:
    """They used to end in the top-level usage line: "unrecognized arguments"."""
    cli.config_from_args(_parse("--start-method", "spawn", "--role", "trainer", "--run-path",
                                "train.py"))
    for flag, says in (("--tee", "--log-dir DIR"), ("--local-addr", "GLOO_SOCKET_IFNAME"),
                       ("--no-python", "Python script or module")):
        with pytest.raises(SystemExit) as exited:
            _parse(flag, "3", "train.py") if flag != "--no-python" else _parse(flag, "t.py")
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert f"{flag} is a torchrun flag potluck run does not support" in err and says in err


def test_an_unwritable_log_dir_is_refused_before_any_worker_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code = cli.main(_parse("--log-dir", str(blocker / "logs"), __file__))
    assert code == 2
    err = capsys.readouterr().err
    assert f"--log-dir {blocker / 'logs'}: cannot write there" in err
    assert "Traceback" not in err


def test_the_token_comes_from_the_flag_a_file_or_the_environment(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("from-file\nignored second line\n")
    env = {"POTLUCK_TOKEN": "from-env"}
    assert cli.resolve_token("from-flag", None, env) == "from-flag"
    assert cli.resolve_token(None, str(secret), env) == "from-file"
    assert cli.resolve_token(None, None, env) == "from-env"
    assert cli.resolve_token(None, None, {}) is None
    with pytest.raises(ConfigError, match="keep one"):
        cli.resolve_token("a", str(secret), {})
    with pytest.raises(ConfigError, match=f"--token-file {tmp_path / 'absent'}: cannot read it"):
        cli.resolve_token(None, str(tmp_path / "absent"), {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty: write the secret on its first line"):
        cli.resolve_token(None, str(tmp_path / "empty"), {})


def test_an_elastic_job_without_a_token_is_refused_before_any_worker_starts(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("POTLUCK_TOKEN", raising=False)
    assert cli.main(_parse("--elastic", __file__)) == 2
    err = capsys.readouterr().err
    assert "--elastic needs the job's shared secret" in err
    assert "export POTLUCK_TOKEN" in err and "--token-file" in err
    monkeypatch.setenv("POTLUCK_TOKEN", "from-env")
    config = cli.require_token(cli.config_from_args(_parse("--elastic", "t.py")))
    assert config.token == "from-env"
    assert cli.require_token(cli.config_from_args(_parse("t.py"))).elastic is False


def test_a_missing_script_is_refused_before_any_worker_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "trian.py"
    assert cli.main(_parse(str(missing))) == 2
    err = capsys.readouterr().err
    assert f"no script file '{missing}'" in err and "Traceback" not in err
    assert cli.main(_parse(str(tmp_path))) == 2
    assert "it is a directory" in capsys.readouterr().err
    cli.check_script(cli.config_from_args(_parse("-m", "some.module")))  # not looked up


def test_nproc_auto() -> None:
    assert cli.parse_nproc("auto", gpus=0, cpus=6) == 6
    assert cli.parse_nproc("auto", gpus=2, cpus=6) == 2
    assert cli.parse_nproc("cpu", gpus=2, cpus=6) == 6
    with pytest.raises(ConfigError, match="no CUDA device"):
        cli.parse_nproc("gpu", gpus=0, cpus=6)


def test_store_port_default() -> None:
    assert LaunchConfig("t.py").port_to_host() == 0
    assert LaunchConfig("t.py", nnodes=2).port_to_host() == 29500
    assert LaunchConfig("t.py", master_port=7000).port_to_host() == 7000


def test_elastic_flags_hand_the_token_to_workers_and_never_show_it() -> None:
    config = cli.config_from_args(_parse("--elastic", "--token", "hush", "--nproc-per-node",
                                         "2", "t.py"))
    assert config.elastic and config.token == "hush"
    assert "hush" not in repr(config)
    env = read_worker_env(_environ(config, 0))
    assert env.token == "hush" and "hush" not in repr(env)
    plain = cli.config_from_args(_parse("t.py"))
    assert not plain.elastic and read_worker_env(_environ(plain, 0)).token is None


def test_workers_found_dead_in_one_poll_are_handled_in_the_order_they_failed(
        tmp_path: Path) -> None:
    """A crash takes its peers' collectives down with it, and the agent may find both
    dead in one poll: the one whose exception came first is handled (named, restarted)
    first, whatever its rank; one with no error file after those that have one."""
    import json
    from types import SimpleNamespace

    from potluck.launch.agent import _failed_at

    def worker(rank: int, at: float | None) -> Any:
        path = tmp_path / f"error-{rank}.json"
        if at is not None:
            path.write_text(json.dumps({"timestamp": at, "exc_type": "E", "message": "m",
                                        "traceback": ""}))
        return SimpleNamespace(rank=rank, error_file=str(path))

    found = [worker(0, 1000.5), worker(1, 1000.2), worker(2, None), worker(3, 1000.2)]
    assert [w.rank for w in sorted(found, key=_failed_at)] == [1, 3, 0, 2]


@pytest.mark.parametrize(("argv", "refused"), [
    (("--token", "abc"), "--token only applies to --elastic runs"),
    (("--no-warm-spare",), "--no-warm-spare only applies to --elastic runs"),
    (("--token-file", __file__, "--no-warm-spare"),
     "--token-file and --no-warm-spare only apply to --elastic runs"),
])
def test_elastic_only_flags_without_elastic_are_refused(
        argv: tuple[str, ...], refused: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(_parse(*argv, __file__)) == 2
    err = capsys.readouterr().err
    assert refused in err and "add --elastic or drop" in err and "Traceback" not in err
    elastic = cli.config_from_args(_parse("--elastic", *argv, "t.py"))  # fine with it
    assert elastic.elastic and elastic.warm_spare is ("--no-warm-spare" not in argv)


def test_a_token_in_the_environment_does_not_refuse_a_fixed_job(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POTLUCK_TOKEN", "exported-for-another-job")
    assert cli.config_from_args(_parse("t.py")).elastic is False


@pytest.mark.parametrize("endpoint,addr,port", [
    ("10.0.0.1", "10.0.0.1", 29400),  # no port: torchrun's default for the endpoint
    ("node-3.cluster.local:29501", "node-3.cluster.local", 29501),
    ("[fd00::1]:29502", "fd00::1", 29502),
    ("[fd00::1]", "fd00::1", 29400),
    ("fd00::1", "fd00::1", 29400),
])
def test_the_endpoint_takes_torchruns_forms(endpoint: str, addr: str, port: int) -> None:
    config = cli.config_from_args(_parse("--rdzv-endpoint", endpoint, "t.py"))
    assert (config.master_addr, config.master_port) == (addr, port)


def test_the_endpoint_and_master_flags_must_agree() -> None:
    with pytest.raises(ConfigError, match=r"--rdzv-endpoint 127\.0\.0\.1:29556 and "
                       r"--master-port 29557 name two different ports"):
        cli.config_from_args(_parse("--rdzv-endpoint", "127.0.0.1:29556", "--master-port",
                                    "29557", "t.py"))
    with pytest.raises(ConfigError, match="name two different hosts"):
        cli.config_from_args(_parse("--rdzv-endpoint", "127.0.0.1:29556", "--master-addr",
                                    "10.0.0.1", "t.py"))
    same = cli.config_from_args(_parse("--rdzv-endpoint", "10.0.0.1:29556", "--master-port",
                                       "29556", "--master-addr", "10.0.0.1", "t.py"))
    assert (same.master_addr, same.master_port) == ("10.0.0.1", 29556)
    assert cli.config_from_args(_parse("t.py")).master_addr == "127.0.0.1"


@pytest.mark.parametrize("addr", ["not..valid", "a" * 64 + ".example.com", "", " "])
def test_a_malformed_master_addr_is_refused_with_exit_2(
        addr: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(_parse("--master-addr", addr, __file__)) == 2
    err = capsys.readouterr().err
    assert f"--master-addr {addr!r} is" in err and "e.g. 10.0.0.1" in err
    assert "Traceback" not in err and "UnicodeError" not in err
    with pytest.raises(ConfigError, match=r"--rdzv-endpoint 'not\.\.valid' is not a hostname"):
        cli.config_from_args(_parse("--rdzv-endpoint", "not..valid:29500", "t.py"))
    for good in ("10.0.0.1", "::1", "node-3.cluster.local"):
        cli.check_host("--master-addr", good)


def test_an_unresolvable_name_on_node_0_is_a_config_error_not_a_unicode_error() -> None:
    from potluck.launch.store import check_local_address

    with pytest.raises(ConfigError, match=r"'not\.\.valid' does not resolve"):
        check_local_address("not..valid")


def test_a_whitespace_token_is_refused_like_an_empty_one(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("POTLUCK_TOKEN", "  \t")
    assert cli.main(_parse("--elastic", __file__)) == 2
    err = capsys.readouterr().err
    assert "the job's shared secret is only whitespace" in err
    assert "openssl rand -hex 16" in err and "\t" not in err  # never echoed
    with pytest.raises(ConfigError, match="only whitespace"):
        cli.require_token(cli.config_from_args(_parse("--elastic", "--token", " ", "t.py")))


def test_a_metrics_dir_that_is_a_file_is_refused_before_any_worker_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "hostname"
    blocker.write_text("not a directory")
    assert cli.main(_parse("--metrics-dir", str(blocker), __file__)) == 2
    err = capsys.readouterr().err
    assert f"--metrics-dir {blocker}: it is a file, not a directory" in err
    assert "e.g. --metrics-dir runs/metrics" in err and "Traceback" not in err
    assert cli.main(_parse("--metrics-dir", str(blocker / "m"), __file__)) == 2
    assert "cannot write there" in capsys.readouterr().err
    fresh = tmp_path / "new" / "metrics"
    cli.check_writable_dir("--metrics-dir", str(fresh), example="m")
    assert fresh.is_dir() and not any(fresh.iterdir())  # created, no probe left behind


def test_a_scripts_own_sys_exit_is_named_as_such() -> None:
    exited = WorkerResult(0, 0, 100, 3, 1.0, error=ErrorRecord(
        0.9, "SystemExit", "3", "Traceback...\n    sys.exit(3)\nSystemExit: 3\n"))
    text = format_report([exited, _result(1, -15, 1.1, stopped=True)], host="h",
                         node_rank=0)
    assert "error     : the script exited with code 3 via SystemExit (sys.exit(3))" in text
    assert "none recorded" not in text and "sys.exit(3)\n" in text + "\n"
    said = WorkerResult(0, 0, 100, 1, 1.0, error=ErrorRecord(
        0.9, "SystemExit", "no data", "Traceback...\nSystemExit: no data\n"))
    assert "exited with code 1 via SystemExit (sys.exit('no data'))" in format_report(
        [said], host="h", node_rank=0)
    silent = format_report([_result(0, 3, 1.0)], host="h", node_rank=0)  # os._exit(3)
    assert "none recorded (the process exited with code 3 without an exception" in silent
    assert "died without raising" not in silent
