"""One phase of the plain demo (the N-worker run, or the 1-worker baseline), launched the
way the README teaches: the launcher's ``Agent`` runs ``potluck run --nproc-per-node N
-m potluck_lab.demo.worker``, each worker joins with ``potluck.init()``, and rank 0 saves
its measurements for this process to report. Worker output goes to ``workers.log`` in
the run directory; the progress display here (``demo/progress.py``: a bar on a terminal,
plain lines in a file or a pipe) follows the metrics rank 0 appends.
"""

from __future__ import annotations

import secrets
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from potluck.errors import PotluckError
from potluck.launch.config import LaunchConfig
from potluck.metrics.latency import RoundTrips
from potluck_lab.demo.progress import Display, MetricsFollower, make_progress
from potluck_lab.demo.train import TrainConfig, WorkerResult
from potluck_lab.demo.worker import write_phase
from potluck_lab.jobs import run_agent

WORKER_MODULE = "potluck_lab.demo.worker"


class PhaseFailed(PotluckError):
    """A worker of the phase failed; the message carries the launcher's report."""


def run_phase(train: TrainConfig, workers: int, corpus_chars: int, run_dir: Path,
              *, display: Display) -> WorkerResult:
    """Launch ``workers`` workers on ``train``; raises ``PhaseFailed`` or
    ``KeyboardInterrupt`` (every worker is stopped either way)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    name = f"{workers}-worker" if workers == 1 else f"{workers}-workers"
    phase, result = run_dir / f"phase-{name}.json", run_dir / f"result-{name}.pt"
    result.unlink(missing_ok=True)
    if train.metrics_path is None:  # the baseline: its metrics only feed the display
        train = replace(train, metrics_path=str(run_dir / f"metrics-{name}.jsonl"))
        Path(train.metrics_path or "").unlink(missing_ok=True)
    write_phase(phase, train, corpus_chars, result)
    # The N-worker phase has the live status page and writes rank_step journals for
    # `potluck plot`; the baseline only feeds the display.
    main = workers > 1
    launch = LaunchConfig(script=WORKER_MODULE, script_args=("--phase", str(phase)),
                          module=True, nproc_per_node=workers,
                          run_id=f"demo-{secrets.token_hex(4)}", grace_period=3.0,
                          status_port=0 if main else None,
                          metrics_dir=str(run_dir.resolve()) if main else None)
    if main:
        shutil.rmtree(run_dir / "ranks", ignore_errors=True)  # an older run's journals
    total = train.steps if train.stop_after is None else train.stop_after
    progress = MetricsFollower(Path(train.metrics_path or ""),
                               make_progress(display, total, train.label, sys.stdout))
    emitted: list[str] = []
    code = run_agent(launch, run_dir / "workers.log", progress, emitted)
    if code >= 128:
        raise KeyboardInterrupt
    if code != 0 or not result.exists():
        raise PhaseFailed("\n".join(emitted[-40:]) +
                          f"\n(worker output in {run_dir / 'workers.log'})")
    return _load(result)


def _load(path: Path) -> WorkerResult:
    raw: dict[str, Any] = torch.load(path, weights_only=False)
    trips = raw.pop("round_trips")
    return WorkerResult(**raw, round_trips=None if trips is None else RoundTrips(**trips))
