"""The plain demo's progress display, moved by the step records rank 0 appends to its
metrics file.

On a terminal it is a tqdm bar, redrawn in place with carriage returns. Anywhere else
(a file, a pipe, a CI log) a redrawn bar is one endless line, so the demo prints plain
lines instead (``ProgressLines``): the first step, every tenth of the run, the last step,
and any step a while after the previous line, so that a slow run still shows life.
``choose_display`` decides which; ``MetricsFollower`` reads the file on a thread and
hands each batch of new records to the display. With ``shares=True`` (the uneven demo)
both also show each step's split of the global batch (``shares 23/9``: samples per
worker, the records' ``shares``) and say when it moves (``ShareWatch``).
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


def format_shares(counts: Sequence[int]) -> str:
    """Samples per worker of one step: ``[23, 9]`` is ``23/9``."""
    return "/".join(str(int(count)) for count in counts)


def format_speeds(speeds: Sequence[float | None]) -> str:
    """Samples/s per worker, ``?`` for one not measured yet: ``412/160``."""
    return "/".join("?" if speed is None else f"{speed:,.0f}" for speed in speeds)


class ShareWatch:
    """Follows the records' ``shares`` (the split of each step) for a display.

    A move is worth a line of its own (``moved``) once the split is at least a tenth of
    the global batch (one sample at least) away, on some worker, from the split last
    shown; smaller changes, one sample back and forth on noisy speeds, are counted and
    told on the next line (``text``)."""

    def __init__(self, move: float = 0.1) -> None:
        self.current: list[int] | None = None
        self.changes = 0  # since the split last shown
        self._move = move
        self._shown: list[int] | None = None
        self._speeds: list[float | None] = []  # the last record's: the new plan's basis
        self._phase: str | None = None

    def moved(self, record: Record) -> str | None:
        """Take the next record; ``shares 16/16 -> 23/9 (measured 412/160 samples/s)``
        if its split moved far from the one last shown, a line of its own for a new
        ``phase`` (the uneven demo's ``equal``), else None."""
        shares = record.get("shares")
        speeds, self._speeds = self._speeds, list(record.get("speeds") or [])
        if not shares:
            return None
        before, self.current = self.current, [int(count) for count in shares]
        previous, self._phase = self._phase, record.get("phase")
        if before is not None and self._phase == "equal" and previous != "equal":
            self._shown, self.changes = self.current, 0
            return (f"balancing off: equal shares {format_shares(self.current)} from here, "
                    "to measure what balancing gained")
        if before is None:
            self._shown = self.current
            return None
        self.changes += int(before != self.current)
        shown = self._shown or self.current
        least = max(1.0, self._move * sum(self.current))
        if max(abs(a - b) for a, b in zip(shown, self.current, strict=False)) < least:
            return None
        over = f" over {self.changes} changes" if self.changes > 1 else ""
        measured = any(speed is not None for speed in speeds)
        basis = f" (measured {format_speeds(speeds)} samples/s)" if measured else ""
        self._shown, self.changes = self.current, 0
        return f"shares {format_shares(shown)} -> {format_shares(self.current)}{over}{basis}"

    def text(self) -> str | None:
        """``shares 21/11`` (and the changes since the split last shown), now shown."""
        if self.current is None:
            return None
        plural = "s" if self.changes > 1 else ""
        changed = (f" ({self.changes} change{plural} since the last line)" if self.changes
                   else "")
        self._shown, self.changes = self.current, 0
        return f"shares {format_shares(self.current)}{changed}"


class ProgressBar:
    """A tqdm bar: steps done, rate, loss and tokens/s of the newest record (and its
    shares, with a line above the bar for every far move)."""

    def __init__(self, total: int, label: str, *, shares: bool = False) -> None:
        # (no monitor thread: the bar is updated every step, and tqdm's monitor would
        # outlive it for the rest of the process)
        tqdm.monitor_interval = 0
        self._bar = tqdm(total=total, desc=label, unit="step", dynamic_ncols=True)
        self._shares = ShareWatch() if shares else None

    def show(self, records: Sequence[Record]) -> None:
        for record in records:
            self._bar.n = int(record["step"]) + 1
            postfix = {"loss": f"{record['loss']:.3f}",
                       "tok_s": f"{record['tokens_per_s']:,.0f}"}
            if self._shares is not None:
                moved = self._shares.moved(record)
                if moved is not None:
                    self._bar.write(f"step {self._bar.n}: {moved}")
                if self._shares.current is not None:
                    postfix["shares"] = format_shares(self._shares.current)
            self._bar.set_postfix(postfix, refresh=False)
        if records:
            self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


class ProgressLines:
    """One plain line per shown step: ``2 workers: step  8/40  loss 3.812  ...``; with
    ``shares``, ending ``shares 23/9``, and a line for every step whose split moved far."""

    def __init__(self, total: int, label: str, out: TextIO, *, lines: int = 10,
                 interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 shares: bool = False) -> None:
        self._total, self._label, self._out = total, label, out
        self._every = max(1, total // lines)
        self._interval_s, self._clock = interval_s, clock
        self._started = clock()
        self._last_line: float | None = None
        self._shares = ShareWatch() if shares else None

    def show(self, records: Sequence[Record]) -> None:
        for record in records:
            done, now = int(record["step"]) + 1, self._clock()
            moved = self._shares.moved(record) if self._shares is not None else None
            due = (self._last_line is None or done % self._every == 0 or done >= self._total
                   or now - self._last_line >= self._interval_s or moved is not None)
            if due:
                self._out.write(self._line(record, done, now - self._started, moved) + "\n")
                self._out.flush()
                self._last_line = now

    def _line(self, record: Record, done: int, elapsed_s: float, moved: str | None) -> str:
        line = (f"{self._label}: step {done:>{len(str(self._total))}}/{self._total}  loss "
                f"{float(record['loss']):.3f}  {float(record['tokens_per_s']):,.0f} tokens/s  "
                f"{elapsed_s:.1f} s")
        shares = moved or (self._shares.text() if self._shares is not None else None)
        return line if shares is None else f"{line}  {shares}"

    def close(self) -> None:
        pass


def make_progress(display: Display, total: int, label: str, out: TextIO, *,
                  shares: bool = False) -> Progress | None:
    """The display's object; None for ``Display.OFF``."""
    if display is Display.BAR:
        return ProgressBar(total, label, shares=shares)
    if display is Display.LINES:
        return ProgressLines(total, label, out, shares=shares)
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
