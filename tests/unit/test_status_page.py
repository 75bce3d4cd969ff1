"""The status page's header: the run id without "potluck potluck", and what the
efficiency is a ratio of. The page's own script runs under Node.js with a stub DOM
(skipped where there is no ``node``); the browser test shows the whole page."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import resources
from typing import Any

import pytest

PAGE = resources.files("potluck.status").joinpath("page.html").read_text()

# A DOM of named elements, enough for the page's script; fetch never answers.
STUB = """
const nodes = {};
const node = (id) => (nodes[id] ??= {id, textContent: "", hidden: false,
  dataset: {}, classList: {add() {}, remove() {}}, append() {}, replaceChildren() {},
  setAttribute() {}});
globalThis.document = {getElementById: node, title: "", body: node("body"),
  createElement: () => node(Symbol()), createElementNS: () => node(Symbol())};
globalThis.fetch = () => new Promise(() => {});
globalThis.setTimeout = () => 0;
"""


def _header(snapshot: dict[str, Any]) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed: the page's script is shown by the browser test")
    script = re.search(r"<script>(.*?)</script>", PAGE, re.S)
    assert script is not None
    program = (STUB + script.group(1) + f"\nrenderHeader({json.dumps(snapshot)});\n"
               "console.log(JSON.stringify({run: nodes['run']?.hidden ?? null, "
               "run_id: nodes['run-id'].textContent, title: document.title, "
               "efficiency: nodes['efficiency'].textContent}));")
    done = subprocess.run([node, "-e", program], capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_heading_is_potluck_once() -> None:
    assert re.search(r"<h1>potluck</h1>", PAGE)


def test_the_default_run_id_is_not_shown_again() -> None:
    seen = _header({"run_id": "potluck", "step": 7, "efficiency": 0.5})
    assert seen["run"] is True and seen["run_id"] == ""  # hidden
    assert seen["title"] == "potluck · step 7" and seen["efficiency"] == "50.0 %"


def test_a_named_run_is_shown_once_beside_the_heading() -> None:
    seen = _header({"run_id": "demo-1a2b", "step": 7})
    assert seen["run"] is False and seen["run_id"] == "demo-1a2b"
    assert seen["title"] == "potluck · demo-1a2b · step 7"


def test_efficiency_says_what_it_is_a_ratio_of() -> None:
    stat = re.search(r'<span id="efficiency-stat" class="stat" title="([^"]+)">(.*?)</span>\s*'
                     r"</header>", PAGE, re.S)
    assert stat is not None
    tip, shown = stat.groups()
    assert "mean compute time" in tip and "slowest rank's step time" in tip
    assert "(mean compute / slowest step)" in shown
