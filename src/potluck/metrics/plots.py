"""Plots of a run from its JSON-lines journals: plain series first, then the PNGs.

``load_run(run_dir)`` reads the records of ``RUN_DIR/*.jsonl`` and ``RUN_DIR/ranks/*.jsonl``
(``potluck.metrics.journal``) and builds plain series: loss and cohort throughput per
step, each rank's compute, wait and share per step, the run's progress over time and its
events. A step written again (a redone step, a resumed run) keeps its last record, in
the order of the records' ``time``. ``write_plots(series, out_dir)`` draws them with
matplotlib's Agg renderer (no display, no pyplot state) and skips a plot with no data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from potluck.errors import ConfigError
from potluck.metrics.journal import read_journal

Record = Mapping[str, Any]
PATTERNS = ("*.jsonl", "ranks/*.jsonl")
# The plain demo's 1-worker baseline phase (potluck_lab.demo.phase) shares runs/demo but is
# another run over the same step indices: its steps would replace the run's own.
OTHER_RUNS = ("metrics-1-worker.jsonl",)
SIZE_IN, DPI = (8.0, 4.5), 100
STEP_LABEL = "step (global, from 0)"


@dataclass(frozen=True)
class Curve:
    """Points ``(x[i], y[i])`` in increasing ``x``; points with no value are left out."""

    x: tuple[float, ...] = ()
    y: tuple[float, ...] = ()


@dataclass(frozen=True)
class RankCurves:
    """One rank's per-step figures: seconds computing and waiting, share of the batch."""

    rank: int
    compute_s: Curve
    wait_s: Curve
    share: Curve


@dataclass(frozen=True)
class Event:
    """A membership change or another noted event (``what``: checkpoint, rebalance...)."""

    time: float  # wall clock, seconds since the epoch
    step: int | None  # the step it came at or after (None: before the first step)
    label: str  # "generation 2", or the record's ``what``
    text: str


@dataclass(frozen=True)
class RunSeries:
    run_dir: Path
    start: float  # wall clock of the run's first record
    loss: Curve  # by step
    throughput: Curve  # cohort samples/s by step
    ranks: tuple[RankCurves, ...]  # by rank
    progress: Curve  # the last committed step by seconds since ``start``
    events: tuple[Event, ...]  # in time order


# ------------------------------------------------------------------ reading


def journal_files(run_dir: Path) -> list[Path]:
    """The journals of a run, top level first, each level in name order."""
    return [path for pattern in PATTERNS for path in sorted(run_dir.glob(pattern))
            if path.is_file() and path.name not in OTHER_RUNS]


def load_run(run_dir: Path) -> RunSeries:
    """The series of the run in ``run_dir``; ``ConfigError`` if it holds no records."""
    if not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} does not exist (or is not a directory); "
                          f"{_how_to_produce()}")
    records: list[Record] = []
    for path in journal_files(run_dir):
        try:
            records.extend(read_journal(path))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    if not records:
        looked = ", ".join(str(run_dir / pattern) for pattern in PATTERNS)
        raise ConfigError(f"no journal records in {looked}; {_how_to_produce()}")
    try:
        return build_series(run_dir, records)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"a journal record in {run_dir} has a bad field ({exc!r}); "
                          "journals are written by potluck.metrics.journal.Journal only"
                          ) from exc


def _how_to_produce() -> str:
    return ("a run writes its journals when it has a metrics directory, e.g. `potluck demo` "
            "writes runs/demo (then: potluck plot runs/demo)")


def build_series(run_dir: Path, records: Iterable[Record]) -> RunSeries:
    """The series of ``records`` (pure); a later record of a step replaces an earlier one."""
    ordered = sorted(records, key=_time)  # stable: ties keep file and line order
    steps = _last_by_key(ordered, "step", lambda r: int(r["step"]))
    rank_steps = _last_by_key(ordered, "rank_step", lambda r: (int(r["rank"]), int(r["step"])))
    start = min((_time(r) for r in ordered), default=0.0)
    progress = _progress(steps, rank_steps, start)
    return RunSeries(
        run_dir=run_dir, start=start, loss=_loss(steps, rank_steps),
        throughput=_throughput(steps, rank_steps), ranks=_ranks(steps, rank_steps),
        progress=progress, events=_events(ordered, progress, start),
    )


def _time(record: Record) -> float:
    value = record.get("time")
    return float(value) if isinstance(value, (int, float)) else 0.0


def _last_by_key(records: Iterable[Record], kind: str,
                 key: Callable[[Record], Any]) -> dict[Any, Record]:
    last: dict[Any, Record] = {}
    for record in records:
        if record.get("kind") == kind:
            last[key(record)] = record
    return last


def _number(record: Record, field: str) -> float | None:
    value = record.get(field)
    if value is None or isinstance(value, bool):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _either(value: float | None, fallback: float | None) -> float | None:
    return fallback if value is None else value


def _curve(points: Mapping[int, float | None]) -> Curve:
    kept = sorted((x, y) for x, y in points.items() if y is not None)
    return Curve(tuple(float(x) for x, _ in kept), tuple(y for _, y in kept))


def _by_step(rank_steps: Mapping[tuple[int, int], Record]) -> dict[int, list[Record]]:
    """Each step's rank records, lowest rank first."""
    grouped: dict[int, list[Record]] = {}
    for (_, step), record in sorted(rank_steps.items()):
        grouped.setdefault(step, []).append(record)
    return grouped


def _loss(steps: Mapping[int, Record], rank_steps: Mapping[tuple[int, int], Record]) -> Curve:
    """The step record's loss, else the lowest rank's that reported one."""
    points: dict[int, float | None] = {}
    for step, records in _by_step(rank_steps).items():
        points[step] = next((loss for r in records if (loss := _number(r, "loss")) is not None),
                            None)
    for step, record in steps.items():
        points[step] = _either(_number(record, "loss"), points.get(step))
    return _curve(points)


def _throughput(steps: Mapping[int, Record],
                rank_steps: Mapping[tuple[int, int], Record]) -> Curve:
    """The step record's samples/s, else the ranks' samples over the slowest rank's step."""
    points: dict[int, float | None] = {}
    for step, records in _by_step(rank_steps).items():
        samples = [_number(r, "samples") for r in records]
        longest = max((_number(r, "step_s") or 0.0 for r in records), default=0.0)
        if longest > 0 and None not in samples:
            points[step] = sum(s or 0.0 for s in samples) / longest
    for step, record in steps.items():
        points[step] = _either(_number(record, "samples_per_s"), points.get(step))
    return _curve(points)


def _ranks(steps: Mapping[int, Record],
           rank_steps: Mapping[tuple[int, int], Record]) -> tuple[RankCurves, ...]:
    """Per rank: compute_s, wait_s and share (a rank_step's, else the step's ``shares``)."""
    shares: dict[int, dict[int, float | None]] = {}
    for step, record in steps.items():
        counts = [float(c) for c in record.get("shares") or ()]
        for rank, count in enumerate(counts):
            shares.setdefault(rank, {})[step] = count / sum(counts) if sum(counts) else None
    compute: dict[int, dict[int, float | None]] = {}
    wait: dict[int, dict[int, float | None]] = {}
    for (rank, step), record in rank_steps.items():
        compute.setdefault(rank, {})[step] = _number(record, "compute_s")
        wait.setdefault(rank, {})[step] = _number(record, "wait_s")
        share = _number(record, "share")
        if share is not None:
            shares.setdefault(rank, {})[step] = share
    return tuple(RankCurves(rank, _curve(compute.get(rank, {})), _curve(wait.get(rank, {})),
                            _curve(shares.get(rank, {})))
                 for rank in sorted(set(compute) | set(shares)))


def _progress(steps: Mapping[int, Record], rank_steps: Mapping[tuple[int, int], Record],
              start: float) -> Curve:
    """When each step committed: its step record's time, else its last rank's."""
    when: dict[int, float] = {}
    for (_, step), record in rank_steps.items():
        when[step] = max(when.get(step, -math.inf), _time(record))
    when.update((step, _time(record)) for step, record in steps.items())
    kept = sorted((t - start, step) for step, t in when.items())
    return Curve(tuple(t for t, _ in kept), tuple(float(step) for _, step in kept))


# ------------------------------------------------------------------ events


def _events(records: Iterable[Record], progress: Curve, start: float) -> tuple[Event, ...]:
    """One event per membership generation (every member writes one: the slowest
    recovery's is kept) and per distinct noted event, in time order."""
    kept: dict[tuple[Any, ...], tuple[float, Event]] = {}
    for record in records:
        if record.get("kind") != "event":
            continue
        event = _event(record, progress, start)
        if isinstance(record.get("text"), str) or record.get("generation") is None:
            kept.setdefault(("text", event.label, event.text, event.step), (0.0, event))
            continue
        key = ("generation", int(record["generation"]))
        recovery = _number(record, "recovery_s") or 0.0
        if key not in kept or recovery > kept[key][0]:
            kept[key] = (recovery, event)
    return tuple(sorted((event for _, event in kept.values()), key=lambda e: e.time))


def _event(record: Record, progress: Curve, start: float) -> Event:
    at = _time(record)
    step = record.get("step")
    if not isinstance(step, int):
        passed = [s for t, s in zip(progress.x, progress.y, strict=True) if t <= at - start]
        step = int(max(passed)) if passed else None
    what, generation = record.get("what"), record.get("generation")
    label = (str(what) if what is not None
             else f"generation {generation}" if generation is not None else "event")
    text = record.get("text")
    return Event(at, step, label, text if isinstance(text, str) else membership_text(record))


def membership_text(record: Record) -> str:
    """``generation 1: a collective failed; left: host:12; now 2 workers; recovery 0.40 s``."""
    parts = [f"generation {record.get('generation')}: {record.get('cause') or 'changed'}"]
    for field in ("left", "joined"):
        if record.get(field):
            parts.append(f"{field}: " + ", ".join(str(w) for w in record[field]))
    if record.get("world_size") is not None:
        parts.append(f"now {record['world_size']} workers")
    recovery = _number(record, "recovery_s")
    if recovery is not None:
        parts.append(f"recovery {recovery:.2f} s")
    return "; ".join(parts)


# ------------------------------------------------------------------ drawing


def _figure(title: str, *, rows: int = 1, height: float = SIZE_IN[1]) -> Figure:
    figure = Figure(figsize=(SIZE_IN[0], height), dpi=DPI, layout="constrained")
    figure.subplots(rows, 1, sharex=True, squeeze=False)
    figure.suptitle(title)
    return figure


def draw_loss(series: RunSeries) -> Figure:
    figure = _figure(f"Loss: {series.run_dir}")
    axes = figure.axes[0]
    axes.plot(series.loss.x, series.loss.y, color="tab:blue", linewidth=1.2)
    axes.set(xlabel=STEP_LABEL, ylabel="loss (as the script reported it)")
    axes.grid(alpha=0.3)
    return figure


def draw_throughput(series: RunSeries) -> Figure:
    figure = _figure(f"Cohort throughput: {series.run_dir}")
    axes = figure.axes[0]
    axes.plot(series.throughput.x, series.throughput.y, color="tab:green", linewidth=1.2)
    axes.set(xlabel=STEP_LABEL, ylabel="throughput (samples/s)", ylim=(0, None))
    axes.grid(alpha=0.3)
    return figure


def draw_compute_wait(series: RunSeries) -> Figure:
    figure = _figure(f"Per rank: compute vs wait in collectives: {series.run_dir}", rows=2,
                     height=6.0)
    top, bottom = figure.axes
    for ranks in series.ranks:
        top.plot(ranks.compute_s.x, [s * 1e3 for s in ranks.compute_s.y], linewidth=1.0,
                 label=f"rank {ranks.rank}")
        bottom.plot(ranks.wait_s.x, [s * 1e3 for s in ranks.wait_s.y], linewidth=1.0,
                    label=f"rank {ranks.rank}")
    top.set(ylabel="compute (ms/step)", ylim=(0, None))
    bottom.set(xlabel=STEP_LABEL, ylabel="wait (ms/step)", ylim=(0, None))
    for axes in (top, bottom):
        axes.grid(alpha=0.3)
        axes.legend(loc="best", fontsize="small", ncol=min(4, len(series.ranks)))
    return figure


def draw_shares(series: RunSeries) -> Figure:
    figure = _figure(f"Per-rank share of the global batch: {series.run_dir}")
    axes = figure.axes[0]
    for ranks in series.ranks:
        if ranks.share.x:
            axes.plot(ranks.share.x, [s * 100 for s in ranks.share.y], drawstyle="steps-post",
                      linewidth=1.2, label=f"rank {ranks.rank}")
    axes.set(xlabel=STEP_LABEL, ylabel="share of the global batch (%)", ylim=(0, 100))
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    return figure


def draw_events(series: RunSeries) -> Figure:
    figure = _figure(f"Events over the run: {series.run_dir}")
    axes = figure.axes[0]
    if series.progress.x:
        axes.plot(series.progress.x, series.progress.y, color="0.6", linewidth=1.0,
                  label="last committed step")
        axes.legend(loc="lower right", fontsize="small")
    axes.set(xlabel="time since the run's first record (s)", ylabel="step committed")
    axes.grid(alpha=0.3)
    if not series.events:
        axes.text(0.5, 0.5, "no events (membership changes, checkpoints, rebalances, "
                  "trust)", transform=axes.transAxes, ha="center", va="center",
                  fontsize=14, color="0.3")
        return figure
    for index, event in enumerate(series.events):
        at = event.time - series.start
        axes.axvline(at, color=f"C{index % 10}", linestyle="--", linewidth=1.0)
        axes.annotate(f"{event.label}: {_shorten(event.text, 50)}", (at, 1.0),
                      xycoords=("data", "axes fraction"), xytext=(3, -4),
                      textcoords="offset points", rotation=90, va="top", ha="left",
                      fontsize=7, color=f"C{index % 10}")
    return figure


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# (file, drawing, has its data, why it is skipped otherwise)
PLOTS: tuple[tuple[str, Callable[[RunSeries], Figure], Callable[[RunSeries], bool], str], ...] = (
    ("loss.png", draw_loss, lambda s: bool(s.loss.x), "no loss reported"),
    ("throughput.png", draw_throughput, lambda s: bool(s.throughput.x),
     "no samples_per_s, nor rank_step samples and step_s"),
    ("compute_wait.png", draw_compute_wait,
     lambda s: any(r.compute_s.x or r.wait_s.x for r in s.ranks), "no rank_step records"),
    ("shares.png", draw_shares, lambda s: any(r.share.x for r in s.ranks),
     "no rank_step shares, nor step shares"),
    ("events.png", draw_events, lambda s: True, ""),
)


def skipped_plots(series: RunSeries) -> list[tuple[str, str]]:
    """``(file, why)`` of each plot ``write_plots`` leaves out for lack of data."""
    return [(name, why) for name, _, has_data, why in PLOTS if not has_data(series)]


def write_plots(series: RunSeries, out_dir: Path) -> list[Path]:
    """Write each plot that has data to ``out_dir`` (created); the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw, has_data, _ in PLOTS:
        if has_data(series):
            path = out_dir / name
            draw(series).savefig(path, dpi=DPI)
            written.append(path)
    return written
