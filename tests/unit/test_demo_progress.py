"""The plain demo's progress: a bar on a terminal, plain lines in a file or a pipe."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from potluck_lab.demo.progress import (
    Display,
    MetricsFollower,
    ProgressLines,
    choose_display,
    make_progress,
)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _record(step: int) -> dict[str, float]:
    return {"step": step, "loss": 4.0 - 0.05 * step, "tokens_per_s": 12345.6}


@pytest.mark.timeout(30)
def test_the_bar_needs_a_terminal_on_both_streams() -> None:
    tty, pipe = _Terminal(), io.StringIO()
    assert choose_display(True, tty, tty) is Display.BAR
    assert choose_display(True, pipe, tty) is Display.LINES  # potluck demo > out.txt
    assert choose_display(True, tty, pipe) is Display.LINES  # potluck demo 2> err.txt
    assert choose_display(False, tty, tty) is Display.OFF
    assert make_progress(Display.OFF, 40, "2 workers", pipe) is None


@pytest.mark.timeout(30)
def test_a_pipe_gets_separate_plain_lines_from_the_metrics_file(tmp_path: Path) -> None:
    metrics, out = tmp_path / "metrics.jsonl", io.StringIO()
    follower = MetricsFollower(metrics, make_progress(
        choose_display(True, out, out), total=40, label="2 workers", out=out))
    with metrics.open("w") as file:
        for step in range(25):
            file.write(json.dumps(_record(step)) + "\n")
        file.write('{"step": 25, "lo')  # a line still being written is not read yet
    follower.follow()
    with metrics.open("a") as file:
        file.write('ss": 2.7, "tokens_per_s": 1.0}\n')
        for step in range(26, 40):
            file.write(json.dumps(_record(step)) + "\n")
    follower.stop()  # reads the rest

    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    # The first step, every tenth of the run (4 steps), and the last.
    assert [line.split()[3] for line in lines] == [f"{n}/40" for n in [1, *range(4, 41, 4)]]
    assert lines[0].startswith("2 workers: step  1/40  loss 4.000  12,346 tokens/s  ")
    assert lines[-1].startswith("2 workers: step 40/40  loss 2.050  ")


@pytest.mark.timeout(30)
def test_a_slow_run_also_gets_a_line_every_interval() -> None:
    now = [0.0]
    out = io.StringIO()
    lines = ProgressLines(600, "1 worker", out, interval_s=10.0, clock=lambda: now[0])
    for step in range(30):  # 3 s a step: far from the next tenth (step 60)
        now[0] = 3.0 * (step + 1)
        lines.show([_record(step)])
    shown = [int(line.split()[3].split("/")[0]) for line in out.getvalue().splitlines()]
    assert shown == [1, 5, 9, 13, 17, 21, 25, 29]  # the first, then every 4th (12 s > 10 s)
