"""``potluck bench``'s flags: every bad value exits 2 (argparse's convention) with a
message naming it, before the bench runs; a ``--json`` path that could not be written
is one of them, for every bench."""

from __future__ import annotations

from pathlib import Path

import pytest

from potluck.cli import main
from potluck_lab.commands import BENCH

_NAMES = [command.name for command in BENCH.subcommands]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bench", _NAMES)
def test_an_unwritable_json_path_is_refused_before_any_bench_runs(
        bench: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", bench, "--json", "/proc/nope/results.json"]) == 2
    err = capsys.readouterr().err
    assert f"potluck bench {bench}: --json /proc/nope/results.json: cannot create its " \
           "directory /proc/nope" in err
    assert "e.g. --json results.json" in err


@pytest.mark.timeout(30)
def test_a_json_path_that_is_a_directory_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "ddp", "--json", str(tmp_path)]) == 2
    assert f"--json {tmp_path} is a directory: name a file in it" in capsys.readouterr().err


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("argv", "message"), [
    (["ddp", "--rounds", "0"], "--rounds 0 must be at least 1; use e.g. --rounds 8"),
    (["ddp", "--steps", "0"], "--steps 0 must be at least 1"),
    (["ddp", "--world-size", "1"], "--world-size 1 must be at least 2"),
    (["ddp", "--bucket-cap-mb", "0"], "--bucket-cap-mb 0 must be a positive size"),
    (["ddp", "--models", "resnet"], "unknown model(s) ['resnet']; choose from mlp"),
    (["allreduce", "--rounds", "0"], "--rounds 0 must be at least 1"),
    (["allreduce", "--world-size", "1"], "--world-size 1 must be at least 2"),
    (["allreduce", "--sizes", "8"], "size '8' is below 32 bytes"),
    (["allreduce", "--sizes", "lots"], "bad size 'LOTS'"),
    (["chaos", "--trials", "0"], "--trials 0 must be at least 1"),
    (["faults", "--rounds", "0"], "--rounds 0 must be at least 1"),
    (["wan", "--batches", "0"], "--batches 0 must be at least 1"),
    (["wan", "--inner-steps", "0"], "--inner-steps 0 must be at least 1"),
    (["wan", "--bandwidth", "10xyz"], "--bandwidth '10xyz' must be a tc rate, e.g. 10mbit"),
    (["wan", "--bandwidth", "0mbit"], "--bandwidth '0mbit' is 0 bits a second"),
    (["loader", "--workers", "0"], "--workers 0 must be at least 1; use e.g. --workers 2"),
    (["loader", "--steps", "3"], "--steps 3 must be at least 4"),
    (["loader", "--sample-ms", "0"], "--sample-ms 0 must be at least 0.01"),
    (["byzantine", "--attack", "ipm"],
     "--attack ipm attacks a round's pseudo-gradient: add --sync diloco, or choose from "
     "sign_flip, noise, nan, alie, stale, bit_flip"),
    (["byzantine", "--sync", "diloco", "--attack", "stale"],
     "--attack stale attacks each step's gradient, not a round's pseudo-gradient; with "
     "--sync diloco choose from sign_flip, noise, nan, alie, ipm"),
])
def test_bad_counts_exit_2_naming_the_flag(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert f"potluck bench {argv[0]}: " in err and message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(("error", "code"), [("config", 2), ("lost", 1)])
def test_a_jobs_refused_settings_exit_2_and_its_other_failures_1(
        error: str, code: int, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from potluck.errors import ConfigError, PeerLostError
    from potluck_lab.driver import Bench, drive

    def measure(config: None, logs: Path) -> None:
        if error == "config":
            raise ConfigError("prepare(...) refused the job's settings: the fix")
        raise PeerLostError("a peer was lost", rank=0, generation=0, cause="gone")

    bench: Bench[None, None] = Bench("probe", lambda args: None, measure,
                                     lambda c, r: [], lambda c, r: {})
    assert drive(bench, argparse.Namespace()) == code
    assert "potluck bench probe: " in capsys.readouterr().err
