"""The WAN demo's and bench's ``--bandwidth``: a rate ``tc`` would refuse is refused
(exit 2) before any namespace is built, and an ``ip`` / ``tc`` failure while the hosts
are built is one line of error (exit 1), not a traceback."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from potluck.errors import ConfigError
from potluck_lab.bench.wan import WanConfig, rate_bits
from potluck_lab.demo import cli, wan
from potluck_lab.machine.netns import NetnsError


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(("rate", "bits"), [
    ("10mbit", 10e6), ("10MBit", 10e6), ("1.5gbit", 1.5e9), ("100", 100.0), ("8bit", 8.0),
    ("125kbps", 1e6), ("1e6bit", 1e6), (".5mbit", 5e5), ("2mibit", 2 * 2**20),
    ("1TBPS", 8e12),
])
def test_tc_rates_are_read_in_bits_a_second(rate: str, bits: float) -> None:
    assert rate_bits(rate) == pytest.approx(bits)


@pytest.mark.parametrize("rate", ["10xyz", "fast", "mbit", "", "-5mbit", "10 mbit",
                                  " 10mbit", "10%", "10mbit/s", "0x10mbit", "10e"])
def test_what_tc_cannot_read_is_refused_with_the_rule_and_an_example(rate: str) -> None:
    with pytest.raises(ConfigError) as refused:
        rate_bits(rate)
    message = str(refused.value)
    assert message.startswith(f"--bandwidth {rate!r} must be a tc rate, e.g. 10mbit: a "
                              "number and an optional unit")
    assert "kbit, mbit, gbit" in message and "in any case" in message


@pytest.mark.parametrize(("rate", "shown"), [("0mbit", "0"), ("0", "0"), ("7bit", "7"),
                                             ("0.5Bps", "4"), ("1e999bit", "inf")])
def test_a_rate_under_a_byte_a_second_or_infinite_is_refused(rate: str, shown: str) -> None:
    with pytest.raises(ConfigError, match=rf"^--bandwidth '{rate}' is {shown} bits a second: "
                                          r"the link's rate must be at least one byte a "
                                          r"second \(8bit\) and finite; use e\.g\. "
                                          r"--bandwidth 10mbit$"):
        rate_bits(rate)


def test_the_demo_and_the_bench_share_the_check() -> None:
    for bad in ("10xyz", "0mbit"):
        with pytest.raises(ConfigError, match=f"--bandwidth '{bad}'"):
            wan.config_from_args(_parse("--wan", "--bandwidth", bad))
        with pytest.raises(ConfigError, match=f"--bandwidth '{bad}'"):
            WanConfig(bandwidth=bad).validated()
    assert wan.config_from_args(_parse("--wan", "--bandwidth", "5MBIT")).bandwidth == "5MBIT"
    assert WanConfig(bandwidth="100mbit").validated().bandwidth == "100mbit"


def test_a_bad_rate_exits_2_before_any_host_is_built(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def no_hosts(*_: Any) -> None:
        raise AssertionError("the hosts must not be built for a bad --bandwidth")

    monkeypatch.setattr(wan, "LinkedHosts", no_hosts)
    assert cli.main(_parse("--wan", "--quick", "--bandwidth", "10xyz")) == 2
    err = capsys.readouterr().err
    assert "potluck demo: error: --bandwidth '10xyz' must be a tc rate" in err
    assert "Traceback" not in err


class _RefusingHosts:
    """Stands in for ``LinkedHosts``: tc refuses the cap, as it would a rate it cannot
    take (its usage text follows on the next lines)."""

    def __init__(self, prefix: str) -> None:
        pass

    def __enter__(self) -> _RefusingHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def limit(self, rate: str) -> None:
        raise NetnsError(f"`tc -n pl-demo-a qdisc replace dev plvdemoa root tbf rate {rate}` "
                         f'failed: tbf: illegal value for "rate": "{rate}"\nUsage: ... tbf '
                         "limit BYTES burst BYTES[/BYTES] rate KBPS")


def test_a_failure_to_build_the_hosts_is_one_line_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(wan, "unavailable", lambda: None)
    monkeypatch.setattr(wan, "LinkedHosts", _RefusingHosts)
    monkeypatch.setattr(wan.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    assert cli.main(_parse("--wan", "--quick")) == 1
    err = capsys.readouterr().err
    assert err.endswith('potluck demo --wan: `tc -n pl-demo-a qdisc replace dev plvdemoa root '
                        'tbf rate 10mbit` failed: tbf: illegal value for "rate": "10mbit"\n')
    assert "Usage" not in err and "Traceback" not in err
