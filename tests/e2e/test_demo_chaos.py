"""``potluck demo --chaos --quick`` as a user runs it: a worker is SIGKILLed once a third of
the steps have committed, the launcher restarts it, it rejoins (the survivors wait for it
two thirds of the way if they must), and the run ends with every step."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from potluck.metrics.journal import read_journal
from potluck_lab.demo.chaos import CHAOS_QUICK
from tests.e2e.helpers import pid_alive


@pytest.mark.timeout(170)
def test_chaos_demo_kills_restores_and_carries_on(tmp_path: Path) -> None:
    plain = tmp_path / "runs" / "demo" / "metrics.jsonl"  # as `make demo` left it
    plain.parent.mkdir(parents=True)
    plain.write_text('{"kind": "step", "step": 0}\n')
    done = subprocess.run(  # the default paths, as a user runs it
        [sys.executable, "-m", "potluck", "demo", "--chaos", "--quick"],
        capture_output=True, text=True, timeout=160, cwd=tmp_path,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert plain.read_text() == '{"kind": "step", "step": 0}\n'  # not the chaos run's
    assert sorted(p.name for p in plain.parent.iterdir()) == ["metrics.jsonl"]
    metrics = tmp_path / "runs" / "demo-chaos" / "metrics.jsonl"
    assert f"per-step metrics in {metrics.relative_to(tmp_path)}" in out
    steps = CHAOS_QUICK.steps

    # The victim stops once a third of the steps have committed and is killed there, so
    # the kill line is exact and the next step is the one in flight.
    kill = re.search(r"chaos: SIGKILL to worker 1 \(pid (\d+)\) once step (\d+) had "
                     r"committed", out)
    assert kill is not None, out
    victim, after = int(kill.group(1)), int(kill.group(2))
    assert after == steps // 3, out
    assert f"step {after + 1} was in flight: not applied, redone" in out

    left = re.search(rf"generation (\d+): a collective of the step failed; left: worker 1 "
                     rf"\(pid {victim}\); now 1 worker; recovery [\d.]+ s", out)
    joined = re.search(r"generation (\d+): admitted at a step boundary with the live state; "
                       r"joined: worker 1 \(pid (\d+), restart 1\); now 2 workers", out)
    assert left is not None and joined is not None, out
    assert int(joined.group(1)) > int(left.group(1))
    reborn = int(joined.group(2))
    assert reborn != victim

    # The survivors wait for the restarted worker at the step the header names, if it is
    # not back by then: it is admitted by the boundary after that step at the latest.
    promise = re.search(r"if it has not asked to join once step (\d+) has committed, the "
                        r"others wait for it there", out)
    assert promise is not None, out
    rejoin_by = int(promise.group(1))
    assert rejoin_by == 2 * steps // 3
    back = re.search(rf"worker 1 \(pid {reborn}, restart 1\) is back: restarted by the "
                     r"launcher, received the live state .* trains from step (\d+)", out)
    assert back is not None, out
    first = int(back.group(1))  # the first step it trains, counted from 1
    waited = re.search(rf"chaos: step {rejoin_by} had committed and worker 1 was not back yet: "
                       r"the 1 worker left waited [\d.]+ s for it to ask to join", out)
    if waited:
        assert first == rejoin_by + 2, out  # the step after the wait admitted it
    else:
        assert after + 2 <= first <= rejoin_by + 1, out
    assert f"steps: {steps} of {steps} committed; steps lost: 0" in out
    assert "membership events:" in out and "throughput, 2 workers" in out

    records = read_journal(metrics)
    assert {r["kind"] for r in records} == {"step"}
    assert [r["step"] for r in records] == list(range(steps))  # each step exactly once
    assert [r["step"] for r in records if r["redone"]] == [after]  # 0-based: step after + 1
    alone = first - 1 - after  # the survivor's steps: the redone one up to the rejoin
    expected = [2] * after + [1] * alone + [2] * (steps - after - alone)
    assert [r["workers"] for r in records] == expected
    start = sum(r["loss"] for r in records[:20]) / 20
    end = sum(r["loss"] for r in records[-20:]) / 20
    assert end < start
    assert not pid_alive(victim) and not pid_alive(reborn)  # nothing left running


@pytest.mark.timeout(60)
def test_chaos_with_one_worker_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "potluck", "demo", "--chaos", "--quick", "--workers", "1",
         "--metrics", str(tmp_path / "m.jsonl")],
        capture_output=True, text=True, timeout=50,
    )
    assert done.returncode == 2
    assert "--chaos with --workers 1" in done.stderr
    assert "at least 2 workers" in done.stderr and "use --chaos --workers 2" in done.stderr
    assert not (tmp_path / "records").exists()  # nothing was started
