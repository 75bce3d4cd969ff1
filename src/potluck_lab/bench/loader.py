"""The step loader's worker processes vs reading in the training process vs torch's
DataLoader, on a dataset whose samples cost time to read.

One training process, one torch thread, a small MLP trained step by step on batches of
``--batch`` samples. Each sample costs ``--sample-ms`` to read, two ways (a row each):
``io``, waiting (a file or a network read: ``time.sleep``), and ``cpu``, computing (a
decode: matrix products in one thread). Contenders, interleaved round by round:

- ``in-process``: potluck's loader with ``num_workers=0`` (every read in the loop);
- ``workers``: potluck's loader with ``num_workers=--workers`` reading ahead;
- ``dataloader``: ``torch.utils.data.DataLoader(num_workers=--workers,
  persistent_workers=True)`` over the same samples, the reference a user knows.

Reported: samples a second (the median round, the first steps of each left out as
warm-up) and the ratios ``workers_vs_in_process`` and ``workers_vs_dataloader``. The
ideal, when reads overlap training fully, is ``(read + train) / max(train, read / K)``
for K workers with a free core each; on a machine with fewer cores than ``K + 1`` a
``cpu`` read shares them with training.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from potluck.data import DataCursor
from potluck.data.step_loader import StepLoader
from potluck_lab.common import at_least, median, table
from potluck_lab.driver import Bench, by_contender, drive, run_interleaved
from potluck_lab.models import mlp

CONTENDERS = ("in-process", "workers", "dataloader")
KINDS = ("io", "cpu")
FEATURES, HIDDEN, CLASSES = 64, 512, 8
WARMUP = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=2, help="loader worker processes (2)")
    parser.add_argument("--batch", type=int, default=32, help="samples a step (32)")
    parser.add_argument("--sample-ms", type=float, default=0.5,
                        help="time to read one sample, ms (0.5)")
    parser.add_argument("--steps", type=int, default=30, help="steps a contender's round (30)")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds (4)")
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")


class Costly(torch.utils.data.Dataset[Any]):
    """Samples that take ``ms`` to read: waiting (``io``) or computing (``cpu``)."""

    def __init__(self, size: int, ms: float, kind: str, work: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, FEATURES, generator=gen)
        self.y = torch.randint(0, CLASSES, (size,), generator=gen)
        self.ms, self.kind, self.work = ms, kind, work

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kind == "io":
            time.sleep(self.ms / 1e3)
        else:
            decode(self.work)
        return self.x[i], self.y[i]


def decode(work: int) -> torch.Tensor:
    """``work`` small matrix products: a stand-in for decoding an image."""
    x = torch.full((48, 48), 0.01)
    for _ in range(work):
        x = torch.tanh(x @ x)
    return x


def calibrate(ms: float) -> int:
    """Products of ``decode`` that take about ``ms`` here, in one thread."""
    start = time.perf_counter()
    decode(200)
    each = (time.perf_counter() - start) / 200
    return max(1, round(ms / 1e3 / each))


@dataclass(frozen=True)
class LoaderConfig:
    workers: int
    batch: int
    sample_ms: float
    steps: int
    rounds: int


def config_from_args(args: argparse.Namespace) -> LoaderConfig:
    at_least("--workers", args.workers, 1, "2")
    at_least("--batch", args.batch, 1, "32")
    at_least("--steps", args.steps, WARMUP + 1, "30")
    at_least("--rounds", args.rounds, 1, "4")
    at_least("--sample-ms", args.sample_ms, 0.01, "0.5")
    return LoaderConfig(args.workers, args.batch, args.sample_ms,
                        max(WARMUP + 5, args.steps // 2) if args.quick else args.steps,
                        2 if args.quick else args.rounds)


def main(args: argparse.Namespace) -> int:
    return drive(BENCH, args)


def measure(config: LoaderConfig, logs: Path) -> dict[str, dict[str, Any]]:
    """Per kind of read: each contender's median samples/s and the two ratios."""
    torch.set_num_threads(1)
    work = calibrate(config.sample_ms)
    return {kind: _measure_kind(config, kind, work) for kind in KINDS}


def _measure_kind(config: LoaderConfig, kind: str, work: int) -> dict[str, Any]:
    dataset = Costly(config.batch * (config.steps + 1) * 2, config.sample_ms, kind, work)
    runs = run_interleaved(CONTENDERS, config.rounds, lambda contender, _: _round(
        contender, dataset, config.batch, config.steps, config.workers))
    mid = {c: median(rates) for c, rates in by_contender(runs).items()}
    return {"samples_per_s": mid,
            "workers_vs_in_process": mid["workers"] / mid["in-process"],
            "workers_vs_dataloader": mid["workers"] / mid["dataloader"]}


def _worst(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each ratio's lower value of the two kinds of read."""
    return {key: min(float(results[k][key]) for k in KINDS)
            for key in ("workers_vs_in_process", "workers_vs_dataloader")}


def report_lines(config: LoaderConfig, results: dict[str, dict[str, Any]]) -> list[str]:
    rows = []
    for kind, result in results.items():
        mid = result["samples_per_s"]
        rows.append([kind, mid["in-process"], mid["workers"], mid["dataloader"],
                     f"{result['workers_vs_in_process']:.2f}x",
                     f"{result['workers_vs_dataloader']:.2f}x"])
    return [f"loader: {config.batch} samples a step, {config.sample_ms:g} ms a sample to "
            f"read, {config.workers} worker(s), {config.steps} steps x {config.rounds} rounds "
            "(samples/s, medians)",
            table(["read", "in-process", "workers", "dataloader", "workers/in-process",
                   "workers/dataloader"], rows),
            *(f"{key} {value:.3f} (the lower of io and cpu)"
              for key, value in _worst(results).items())]


def report_json(config: LoaderConfig, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {**_worst(results), "kinds": results, "workers": config.workers,
            "batch": config.batch, "sample_ms": config.sample_ms, "steps": config.steps,
            "rounds": config.rounds}


def _round(contender: str, dataset: Costly, batch: int, steps: int, workers: int) -> float:
    """Samples a second of one contender's round, after its first ``WARMUP`` steps."""
    model = mlp([FEATURES, HIDDEN, HIDDEN, CLASSES], torch.nn.ReLU, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cursor = DataCursor(len(dataset), batch, seed=0)
    loader: Any
    if contender == "dataloader":
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True,
                                             num_workers=workers, persistent_workers=True,
                                             generator=torch.Generator().manual_seed(0))
    else:
        loader = StepLoader(dataset, cursor, lambda: (0, 1),
                            workers=workers if contender == "workers" else 0)
    started = 0.0
    try:
        for step, (x, y) in enumerate(loader):
            if step == WARMUP:
                started = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            opt.zero_grad()
            cursor.commit()
            if step + 1 == steps:
                break
        return (steps - WARMUP) * batch / (time.perf_counter() - started)
    finally:
        if isinstance(loader, StepLoader):
            loader.close()
        else:
            del loader  # (its workers stop with their iterator)


BENCH = Bench("loader", config_from_args, measure, report_lines, report_json)
