"""The status page's events and table through a fixed job's restart.

A 2-worker fixed job (``potluck run --max-restarts 1 --balance``) whose rank 1 is slowed
inside its backward, checkpointing every 10 steps: the page must show the checkpoints
and the balancer's new shares as events. Then rank 1 is SIGKILLed: the launcher restarts
both workers, which resume from the newest checkpoint. The page must then show the new
workers only (the dead ones neither listed nor named as silent), the exit and the
restart as events, and the steps judged again from where the new workers began.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.status_run import LiveRun


def whats(status: dict[str, Any]) -> set[str]:
    return {event["what"] for event in status["events"]}


def workers(status: dict[str, Any]) -> set[str]:
    return {row["worker"] for row in status["ranks"]}


@pytest.mark.timeout(240)
def test_a_restart_leaves_no_dead_rows_and_events_show_checkpoints_and_shares(
        tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    run = LiveRun(tmp_path, "--nproc-per-node", "2", "--max-restarts", "1", "--balance",
                  script_args=("--slow", "1", "--trial-steps", "1000000", "--slow-ms", "20",
                               "--checkpoint-dir", str(checkpoints),
                               "--checkpoint-every", "10"))
    try:
        first = run.wait_for("a checkpoint and a rebalance on the page",
                             lambda s: {"checkpoint", "rebalance"} <= whats(s)
                             and len(s["ranks"]) == 2 and s["step"] >= 25, timeout=120)
        saved = [e for e in first["events"] if e["what"] == "checkpoint"]
        assert saved[0]["step"] == 10 and "saved to" in saved[0]["text"], saved
        rebalance = next(e for e in first["events"] if e["what"] == "rebalance")
        assert "samples per rank" in rebalance["text"]
        old = workers(first)
        victim = next(row for row in first["ranks"] if row["rank"] == 1)
        os.kill(int(victim["worker"].rsplit(":", 1)[1]), signal.SIGKILL)

        after = run.wait_for(
            "the restarted workers alone on the page",
            lambda s: len(s["ranks"]) == 2 and not workers(s) & old
            and min(row["step"] for row in s["ranks"]) >= 10
            and s["slowest"] is not None and not s["slowest"]["silent"], timeout=120)
        assert not any(row["stale"] for row in after["ranks"]), after["ranks"]
        assert {"exit", "restart"} <= whats(after), after["events"]
        exit_text = next(e["text"] for e in after["events"] if e["what"] == "exit")
        assert "SIGKILL" in exit_text and "restarting every worker (1 of 1" in exit_text
        # the new workers' steps are judged: the slowed rank 1 is named again
        assert after["slowest"]["rank"] == 1, after["slowest"]
        assert after["slowest_history"][-1]["rank"] == 1
        assert run.finish() == 0, run.output()
    finally:
        run.close()
