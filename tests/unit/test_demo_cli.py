"""``potluck demo``'s flags: a flag the chosen demo would ignore is refused (exit 2)
before any demo starts, and so is a metrics file that cannot be written."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from potluck.errors import ConfigError
from potluck_lab.demo import cli


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("argv", [("--wan", "--chaos"), ("--wan", "--uneven"),
                                  ("--chaos", "--uneven"), ("--wan", "--chaos", "--uneven")])
def test_two_demos_at_once_are_refused(
        argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(_parse(*argv)) == 2
    err = capsys.readouterr().err
    assert f"{' with '.join(argv)}: they are separate demos" in err
    assert f"e.g. potluck demo {argv[0]}" in err


def test_bandwidth_without_wan_is_refused() -> None:
    with pytest.raises(ConfigError, match="--bandwidth 5mbit is the link rate of the --wan "
                                          "demo only: add --wan, or drop --bandwidth"):
        cli.check_demo_flags(_parse("--bandwidth", "5mbit"))
    cli.check_demo_flags(_parse("--wan", "--bandwidth", "5mbit"))


def test_the_plain_demos_flags_with_wan_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^--resume with --wan: .* drop --resume$"):
        cli.check_demo_flags(_parse("--wan", "--resume"))
    with pytest.raises(ConfigError, match="--steps, --metrics with --wan"):
        cli.check_demo_flags(_parse("--wan", "--steps", "3", "--metrics", "m.jsonl"))
    cli.check_demo_flags(_parse("--wan", "--quick"))
    cli.check_demo_flags(_parse("--quick", "--resume", "--steps", "3"))  # the plain demo's


@pytest.mark.parametrize(("argv", "refused"), [
    (("--seed", "5"), "--seed"),
    (("--checkpoint-dir", "ckpt"), "--checkpoint-dir"),
    (("--checkpoint-every", "100"), "--checkpoint-every"),  # the default's value, given
    (("--checkpoint-dir", "ckpt", "--seed", "1"), "--checkpoint-dir, --seed"),
])
def test_the_wan_demo_refuses_seed_and_checkpoint_flags(
        argv: tuple[str, ...], refused: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(_parse("--wan", *argv)) == 2
    err = capsys.readouterr().err
    assert f"potluck demo: error: {refused} with --wan: the WAN demo keeps no " in err
    assert err.rstrip().endswith(f"drop {refused}") and "Traceback" not in err
    cli.check_demo_flags(_parse("--wan", "--seed", "0"))  # the default: nothing is lost


@pytest.mark.parametrize("demo", ["--chaos", "--uneven"])
@pytest.mark.parametrize("argv", [("--baseline-steps", "5"), ("--no-baseline",),
                                  ("--checkpoint-dir", "ckpt"), ("--checkpoint-every", "0")])
def test_chaos_and_uneven_refuse_the_baseline_and_checkpoint_flags(
        demo: str, argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(_parse(demo, *argv)) == 2
    err = capsys.readouterr().err
    assert f"potluck demo: error: {argv[0]} with {demo}: the {demo[2:]} demo runs no " \
           "1-worker baseline" in err
    assert err.rstrip().endswith(f"drop {argv[0]}") and "Traceback" not in err


def test_flags_a_demo_uses_are_not_refused() -> None:
    used = ("--seed", "3", "--steps", "12", "--batch-size", "8", "--metrics", "m.jsonl",
            "--no-progress", "--quick")
    cli.check_demo_flags(_parse("--chaos", *used))
    cli.check_demo_flags(_parse("--uneven", *used))
    cli.check_demo_flags(_parse(*used, "--baseline-steps", "5", "--checkpoint-dir", "c",
                                "--checkpoint-every", "0", "--resume"))


def test_the_plain_demo_fills_in_its_checkpoint_defaults() -> None:
    config = cli.config_from_args(_parse("--quick"))
    assert (config.checkpoint_dir, config.checkpoint_every) == (cli.CHECKPOINTS, 100)
    config = cli.config_from_args(_parse("--checkpoint-dir", "c", "--checkpoint-every", "0"))
    assert (config.checkpoint_dir, config.checkpoint_every) == (Path("c"), 0)
    with pytest.raises(ConfigError, match=r"--checkpoint-every -1: must be >= 0 .* use e\.g\. "
                                          r"--checkpoint-every 100"):
        cli.config_from_args(_parse("--checkpoint-every", "-1"))


def test_an_unwritable_metrics_path_is_refused_before_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(_parse("--quick", "--metrics", "/proc/nope/m.jsonl")) == 2
    err = capsys.readouterr().err
    assert "--metrics /proc/nope/m.jsonl: cannot write in /proc/nope" in err
    assert "e.g. --metrics runs/demo/metrics.jsonl" in err and "Traceback" not in err
    with pytest.raises(ConfigError, match="is a directory: name a file in it"):
        cli.check_metrics_path(tmp_path)
    nested = tmp_path / "a" / "b" / "m.jsonl"
    cli.check_metrics_path(nested)
    assert nested.parent.is_dir() and not any(nested.parent.iterdir())


def test_each_demo_has_its_own_default_metrics_path() -> None:
    assert cli.metrics_path(_parse()) == cli.METRICS
    assert cli.metrics_path(_parse("--chaos")) == cli.CHAOS_METRICS
    assert cli.metrics_path(_parse("--uneven")) == cli.UNEVEN_METRICS
    assert cli.metrics_path(_parse("--chaos", "--metrics", "x.jsonl")) == Path("x.jsonl")
