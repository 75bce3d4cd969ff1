"""The plain demo's progress display, moved by the step records rank 0 appends to its
metrics file.

On a terminal it is a tqdm bar, redrawn in place with carriage returns. Anywhere else
(a file, a pipe, a CI log) a redrawn bar is one endless line, so the demo prints plain
lines instead (``ProgressLines``): the first step, every tenth of the run, the last step,
and any step a while after the previous line, so that a slow run still shows life.
``choose_display`` decides which; ``MetricsFollower`` reads the file on a thread and
hands each batch of new records to the display.
"""

from __future__ import annotations

import enum
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

from tqdm import tqdm

Record = Mapping[str, Any]


class Display(enum.Enum):
    BAR = "bar"  # tqdm, on a terminal
    LINES = "lines"  # plain lines, for a file or a pipe
    OFF = "off"  # --no-progress


def choose_display(enabled: bool, stdout: TextIO, stderr: TextIO) -> Display:
    """The bar only where both streams are terminals: tqdm draws on stderr, and when
    stdout goes to a file the demo's report is there, so its progress belongs there too."""
    if not enabled:
        return Display.OFF
    return Display.BAR if stdout.isatty() and stderr.isatty() else Display.LINES


class Progress(Protocol):
    def show(self, records: Sequence[Record]) -> None: ...
    def close(self) -> None: ...


class ProgressBar:
    """A tqdm bar: steps done, rate, loss and tokens/s of the newest record."""

    def __init__(self, total: int, label: str) -> None:
        self._bar = tqdm(total=total, desc=label, unit="step", dynamic_ncols=True)

    def show(self, records: Sequence[Record]) -> None:
        for record in records:
            self._bar.n = int(record["step"]) + 1
            self._bar.set_postfix(loss=f"{record['loss']:.3f}",
                                  tok_s=f"{record['tokens_per_s']:,.0f}", refresh=False)
        if records:
            self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


class ProgressLines:
    """One plain line per shown step: ``2 workers: step  8/40  loss 3.812  ...``."""

    def __init__(self, total: int, label: str, out: TextIO, *, lines: int = 10,
                 interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._total, self._label, self._out = total, label, out
        self._every = max(1, total // lines)
        self._interval_s, self._clock = interval_s, clock
        self._started = clock()
        self._last_line: float | None = None

    def show(self, records: Sequence[Record]) -> None:
        for record in records:
            done, now = int(record["step"]) + 1, self._clock()
            due = (self._last_line is None or done % self._every == 0 or done >= self._total
                   or now - self._last_line >= self._interval_s)
            if due:
                self._out.write(self._line(record, done, now - self._started) + "\n")
                self._out.flush()
                self._last_line = now

    def _line(self, record: Record, done: int, elapsed_s: float) -> str:
        return (f"{self._label}: step {done:>{len(str(self._total))}}/{self._total}  loss "
                f"{float(record['loss']):.3f}  {float(record['tokens_per_s']):,.0f} tokens/s  "
                f"{elapsed_s:.1f} s")

    def close(self) -> None:
        pass


def make_progress(display: Display, total: int, label: str, out: TextIO) -> Progress | None:
    """The display's object; None for ``Display.OFF``."""
    if display is Display.BAR:
        return ProgressBar(total, label)
    if display is Display.LINES:
        return ProgressLines(total, label, out)
    return None


class MetricsFollower:
    """A thread that hands the step records appended to ``metrics`` to ``progress``."""

    def __init__(self, metrics: Path, progress: Progress | None) -> None:
        self._metrics, self._progress = metrics, progress
        self._offset = metrics.stat().st_size if metrics.exists() else 0  # a resumed file
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="demo-progress", daemon=True)

    def start(self) -> None:
        if self._progress is not None:
            self._thread.start()

    def stop(self) -> None:
        """Show the records still unread and close the display."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self.follow()
        if self._progress is not None:
            self._progress.close()

    def _loop(self) -> None:
        while not self._done.wait(0.2):
            self.follow()

    def follow(self) -> None:
        if self._progress is None or not self._metrics.exists():
            return
        if self._metrics.stat().st_size < self._offset:  # rewritten from the start
            self._offset = 0
        with self._metrics.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
        self._offset += len(complete)
        self._progress.show([json.loads(line) for line in complete.splitlines()])
