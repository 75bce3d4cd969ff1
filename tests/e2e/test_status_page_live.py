"""The status page of a live 2-worker elastic run, as a person sees it in a browser.

A real headless Chromium (installed with apt-get when missing on a root Debian machine,
as CI's is; skipped elsewhere) opens the page ``potluck run --status-port 0`` printed:
both ranks are in the table and the step advances between two looks; after one worker
is SIGKILLed, the page shows the loss in its events and the table keeps the survivor.
A screenshot is kept as a test artifact (``test-artifacts/``).
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests import browser
from tests.e2e.status_run import LiveRun


def shown_step(dom: str) -> int:
    found = re.search(r'id="step"[^>]*>(\d+)<', dom)
    assert found is not None, f"no step number on the page:\n{dom[:3000]}"
    return int(found.group(1))


def rows(dom: str) -> list[int]:
    return [int(r) for r in re.findall(r'<tr data-rank="(\d+)"', dom)]


@pytest.mark.timeout(900)  # a first run may apt-get install Chromium
def test_live_page_shows_both_ranks_the_step_and_a_loss(tmp_path: Path) -> None:
    if browser.ensure_chromium() is None:
        why = browser.why_no_install() or "apt-get install chromium failed"
        pytest.skip(f"headless Chromium is missing and cannot be installed here: {why}")
    run = LiveRun(tmp_path, "--elastic", "--token", "status-test", "--nproc-per-node", "2",
                  script_args=("--step-ms", "20"))
    try:
        status = run.wait_for("two ranks stepping",
                              lambda s: s["world_size"] == 2 and s["step"] >= 3)
        first = browser.dump_dom(run.url, wait_ms=1500)
        assert rows(first) == [0, 1]
        run.wait_for("more steps", lambda s: s["step"] >= shown_step(first) + 10)
        second = browser.dump_dom(run.url, wait_ms=1500)
        assert shown_step(second) > shown_step(first)

        victim = next(r for r in status["ranks"] if r["rank"] == 1)
        os.kill(int(victim["worker"].rsplit(":", 1)[1]), signal.SIGKILL)
        run.wait_for("the loss on the page",
                     lambda s: s["world_size"] == 1
                     and any(e["what"] == "loss" for e in s["events"]))
        after = browser.dump_dom(run.url, wait_ms=1500)
        events = re.search(r'<ol id="events"[^>]*>(.*?)</ol>', after, re.S)
        assert events is not None and " left" in events.group(1), after[:3000]
        assert "generation 1" in events.group(1)
        assert rows(after) == [0]
        shot = browser.screenshot(run.url, tmp_path / "status-page-live.png", wait_ms=1500)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
        browser.keep_artifact(shot)
        assert run.finish() == 0, run.output()
    finally:
        run.close()
