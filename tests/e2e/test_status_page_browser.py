"""The live status page as a person sees it: served by StatusServer, rendered by Chromium.

Runs a real headless Chromium (installed with apt-get when missing on a root Debian
machine; skipped elsewhere) against a changing fake snapshot.
"""

from __future__ import annotations

import itertools
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from potluck.status import StatusServer
from tests import browser

REASON = "rank 1: forward+backward 210 ms vs median 95 ms"
EVENT = "generation 1: worker-2 left (a collective of the step failed)"


def need_chromium() -> None:
    if browser.ensure_chromium() is None:
        why = browser.why_no_install() or "apt-get install chromium failed"
        pytest.skip(f"headless Chromium is missing and cannot be installed here: {why}")


def rank(n: int, step: int) -> dict[str, Any]:
    return {
        "rank": n, "worker": f"node{n}:{4000 + n}", "host": f"node{n}", "generation": 1,
        "step": step, "phase": "computing" if n == 0 else "all-reduce", "phase_s": 0.01,
        "last_seen_s": 0.2, "stale": False, "compute_ms": 95.0 if n == 0 else 210.0,
        "wait_ms": 110.0 if n == 0 else 2.0, "comm_ms": 120.0, "step_ms": 215.0,
        "bytes": 3 * 1048576, "samples": 16, "share": 0.5,
        "samples_per_s": 168.0 if n == 0 else 76.0, "trust": None,
    }


class ChangingSnapshot:
    """A fake launcher: each call is one step further on."""

    def __init__(self) -> None:
        self.steps = itertools.count(40)
        self.last = -1

    def __call__(self) -> Mapping[str, Any]:
        step = self.last = next(self.steps)
        return {
            "run_id": "browser-test", "time": time.time(), "step": step, "generation": 1,
            "world_size": 2, "global_batch": 32, "ranks": [rank(0, step), rank(1, step)],
            "slowest": {"rank": 1, "reason": REASON, "since_step": 30},
            "slowest_history": [{"step": 30, "rank": 1, "reason": REASON}],
            "events": [{"time": time.time() - 5, "step": 12, "what": "loss", "text": EVENT}],
            "curves": {"step": list(range(step)),
                       "loss": [4.0 / (1 + 0.1 * i) if i % 5 else None for i in range(step)],
                       "samples_per_s": [240.0 + i % 3 for i in range(step)]},
            "efficiency": 0.71,
        }


def visible_text(html: str) -> str:
    """The body's text without tags, scripts or styles, whitespace squeezed."""
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))


@pytest.mark.timeout(900)  # a first run may apt-get install Chromium
def test_status_page_shows_the_cohort(tmp_path: Path) -> None:
    need_chromium()
    snapshot = ChangingSnapshot()
    with StatusServer(snapshot) as server:
        dom = browser.dump_dom(server.url, wait_ms=2500, timeout=60)
        shot = browser.screenshot(server.url, tmp_path / "status-page.png", wait_ms=2500)

    step = re.search(r'id="step"[^>]*>(\d+)<', dom)
    assert step is not None, f"no step number rendered:\n{dom[:2000]}"
    assert 40 < int(step.group(1)) <= snapshot.last  # polled more than once: live data
    assert re.search(r'<tr data-rank="0"', dom) and re.search(r'<tr data-rank="1"', dom)
    banner = re.search(r'<div id="banner"[^>]*>(.*?)</div>', dom, re.S)
    assert banner is not None and REASON in banner.group(1)
    events = re.search(r'<ol id="events"[^>]*>(.*?)</ol>', dom, re.S)
    assert events is not None and EVENT in events.group(1) and "step 12" in events.group(1)
    text = visible_text(dom)
    for seen in ("browser-test", "node0:4000", "node1:4001", "all-reduce", "50.0 %",
                 "3.0 MiB", "71.0 %"):
        assert seen in text
    contact = re.search(r'<div id="contact"([^>]*)>', dom)
    assert contact is not None and "hidden" in contact.group(1)  # in touch: no warning
    assert "<polyline" in dom  # both charts drew a line
    assert shot.stat().st_size > 5000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    browser.keep_artifact(shot)


@pytest.mark.timeout(900)
def test_status_page_says_when_it_lost_contact() -> None:
    need_chromium()

    def broken() -> Mapping[str, Any]:
        raise RuntimeError("the launcher's store is gone")

    with StatusServer(broken) as server:
        dom = browser.dump_dom(server.url, wait_ms=1500, timeout=60)
    contact = re.search(r'<div id="contact"([^>]*)>(.*?)</div>', dom, re.S)
    assert contact is not None
    assert "hidden" not in contact.group(1)
    assert "lost contact with the launcher" in contact.group(2)
    assert "HTTP 500" in contact.group(2)


@pytest.mark.timeout(300)
def test_chromium_runs_under_a_long_temporary_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Chromium's singleton socket goes in $TMPDIR: under a test's long one its path passed
    # a socket's 107 bytes and Chromium aborted ("Socket path too long", exit -6).
    need_chromium()
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    assert len(str(deep)) > 100
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with StatusServer(lambda: {"ranks": [], "events": []}) as server:
        dom = browser.dump_dom(server.url, wait_ms=500, timeout=60)
    assert "<html" in dom
