"""One phase of the plain demo (the N-worker run, or the 1-worker baseline), launched the
way the README teaches: the launcher's ``Agent`` runs ``potluck run --nproc-per-node N
-m potluck.demo.worker``, each worker joins with ``potluck.init()``, and rank 0 saves
its measurements for this process to report. Worker output goes to ``workers.log`` in
the run directory; a progress bar here follows the metrics rank 0 appends.
"""

from __future__ import annotations

import json
import secrets
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from potluck.demo.train import TrainConfig, WorkerResult
from potluck.demo.worker import write_phase
from potluck.errors import PotluckError
from potluck.launch.agent import Agent
from potluck.launch.config import LaunchConfig
from potluck.metrics.latency import RoundTrips

WORKER_MODULE = "potluck.demo.worker"


class PhaseFailed(PotluckError):
    """A worker of the phase failed; the message carries the launcher's report."""


def run_phase(train: TrainConfig, workers: int, corpus_chars: int, run_dir: Path,
              *, progress: bool) -> WorkerResult:
    """Launch ``workers`` workers on ``train``; raises ``PhaseFailed`` or
    ``KeyboardInterrupt`` (every worker is stopped either way)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    name = f"{workers}-worker" if workers == 1 else f"{workers}-workers"
    phase, result = run_dir / f"phase-{name}.json", run_dir / f"result-{name}.pt"
    result.unlink(missing_ok=True)
    if train.metrics_path is None:  # the baseline: its metrics only feed the bar
        train = replace(train, metrics_path=str(run_dir / f"metrics-{name}.jsonl"))
        Path(train.metrics_path or "").unlink(missing_ok=True)
    write_phase(phase, train, corpus_chars, result)
    launch = LaunchConfig(script=WORKER_MODULE, script_args=("--phase", str(phase)),
                          module=True, nproc_per_node=workers,
                          run_id=f"demo-{secrets.token_hex(4)}", grace_period=3.0)
    total = train.steps if train.stop_after is None else train.stop_after
    bar = _ProgressFollower(Path(train.metrics_path or ""), total, train.label,
                            enabled=progress)
    emitted: list[str] = []
    with (run_dir / "workers.log").open("ab") as log:
        def emit(line: str) -> None:
            emitted.append(line)
            log.write(line.encode() + b"\n")
            log.flush()

        bar.start()
        try:
            code = Agent(launch, emit=emit, stdout=log, stderr=log).run()
        finally:
            bar.stop()
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


class _ProgressFollower:
    """A tqdm bar here, moved by the step records rank 0 appends to ``metrics``."""

    def __init__(self, metrics: Path, total: int, label: str, *, enabled: bool) -> None:
        self._metrics, self._enabled = metrics, enabled
        self._offset = metrics.stat().st_size if metrics.exists() else 0  # a resumed file
        self._bar = tqdm(total=total, desc=label, unit="step", dynamic_ncols=True,
                         disable=not enabled)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="demo-progress", daemon=True)

    def start(self) -> None:
        if self._enabled:
            self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._follow()
        self._bar.close()

    def _loop(self) -> None:
        while not self._done.wait(0.2):
            self._follow()

    def _follow(self) -> None:
        if not self._enabled or not self._metrics.exists():
            return
        if self._metrics.stat().st_size < self._offset:  # rewritten from the start
            self._offset = 0
        with self._metrics.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        lines = complete.splitlines()
        for line in lines:
            record = json.loads(line)
            self._bar.n = int(record["step"]) + 1
            self._bar.set_postfix(loss=f"{record['loss']:.3f}",
                                  tok_s=f"{record['tokens_per_s']:,.0f}", refresh=False)
        if lines:
            self._bar.refresh()
