"""``potluck demo --uneven`` as a user runs it, cut short: worker 1 is slowed, the shares
move to worker 0, every step record carries its shares, and no cgroup is left behind.

Worker 1 sleeps (``--slow-by sleep``) rather than taking a CPU quota: a quota is a share
of a core's time, and on this shared machine another job on worker 0's core can make
worker 0 as slow. The balancer then measures two equal workers and rightly keeps equal
shares. A sleep slows worker 1 by the same factor whatever else runs."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from potluck.metrics.journal import read_journal
from potluck_lab.demo.uneven import CGROUP_PREFIX
from potluck_lab.machine.cpu_quota import CPU_ROOT

STEPS, BATCH = 24, 32  # --quick's global batch; a few steps are enough for a move
EQUAL = 16  # --quick's steps on equal shares after the balanced ones


@pytest.mark.serial  # its verdict follows measured speeds: alone, after the parallel part
@pytest.mark.timeout(60)
def test_uneven_demo_moves_the_shares_to_the_fast_worker(tmp_path: Path) -> None:
    demo = subprocess.Popen(  # the default paths, as a user runs it
        [sys.executable, "-m", "potluck", "demo", "--uneven", "--quick", "--steps",
         str(STEPS), "--slow-by", "sleep", "--slow-fraction", "0.25"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    try:
        out, err = demo.communicate(timeout=50)
    finally:
        demo.kill()
    assert demo.returncode == 0, out[-3000:] + err[-3000:]
    assert not (CPU_ROOT / f"{CGROUP_PREFIX}{demo.pid}").exists()  # removed at the end
    assert not (tmp_path / "runs" / "demo").exists()  # apart from the plain demo's
    assert "slowed: worker 1 " in out
    assert "sleeps in every forward pass" in out and "a CPU quota of" not in out, out

    every = read_journal(tmp_path / "runs" / "demo-uneven" / "metrics.jsonl")
    assert [r["step"] for r in every] == list(range(STEPS + EQUAL))
    for record in every:
        assert record["kind"] == "step" and len(record["shares"]) == 2
        assert sum(record["shares"]) == BATCH and min(record["shares"]) >= 1
    records = [r for r in every if r["phase"] == "balanced"]
    assert len(records) == STEPS
    assert all(r["shares"] == [BATCH // 2] * 2 for r in every[STEPS:])  # "equal", after
    assert records[0]["shares"] == [BATCH // 2, BATCH // 2]  # nothing measured yet
    # Once measured (the planner's first plan is for the fifth step), worker 1 trains
    # on fewer samples than an equal share, at most steps.
    assert statistics.median(r["shares"][1] for r in records[4:]) < BATCH // 2, records
    assert re.search(rf"^2 workers: step +\d+/{STEPS + EQUAL}  loss .*  shares \d+/\d+ -> "
                     r"\d+/\d+", out, re.M), out  # a move, on screen
    assert "throughput, balanced:" in out and "throughput, equal shares (16/16):" in out
    assert "balancing off: equal shares 16/16 from here" in out
    assert "shares of the global batch of 32" in out
    # long enough to compare the two throughputs (the figure is the machine's)
    assert "too short to compare" not in out and "nothing to compare" not in out
    assert re.search(r"balancing made the step \d+\.\d\dx as fast", out), out
