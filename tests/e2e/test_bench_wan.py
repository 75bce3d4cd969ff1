"""``potluck bench wan`` as a user runs it: bad flags are clear errors (a full run takes
minutes; its figures are in docs/benchmarks.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.helpers import ROOT


def bench(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "potluck", "bench", "wan", *argv],
                          capture_output=True, text=True, timeout=50, cwd=ROOT)


@pytest.mark.timeout(60)
def test_bad_flags_are_clear_errors() -> None:
    for argv, message in ((["--workers", "3"], "only --workers 2 is built"),
                          (["--batches", "70", "--inner-steps", "20"],
                           "--batches 70 is not a multiple of --inner-steps 20"),
                          (["--quota", "1.5"], "--quota 1.5: a fraction of one core"),
                          (["--bandwidth", "fast"], "a tc rate, e.g. 10mbit")):
        result = bench(*argv)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr
        assert "Traceback" not in result.stderr
