"""The plain demo's worker process, started by the launcher as a user's script would be:

    potluck run --nproc-per-node 2 -m potluck_lab.demo.worker --phase PHASE.json

It joins with ``potluck.init()`` (the README's path), trains with
``demo.train.train_worker`` and, on rank 0, saves what it measured to the phase's
result file for the ``potluck demo`` process to report. The phase file holds the
``TrainConfig`` and the corpus settings, so every worker loads the same text.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

import potluck
from potluck_lab.demo.train import TrainConfig, train_worker
from potluck_lab.models import ModelConfig
from potluck_lab.text import load_corpus


def write_phase(path: Path, config: TrainConfig, corpus_chars: int, result: Path) -> None:
    """The phase file the demo hands its workers (plain JSON)."""
    path.write_text(json.dumps({"train": asdict(config), "corpus_chars": corpus_chars,
                                "result": str(result)}))


def read_phase(path: Path) -> tuple[TrainConfig, int, Path]:
    raw: dict[str, Any] = json.loads(path.read_text())
    train = dict(raw["train"])
    train["model"] = ModelConfig(**train["model"])
    return TrainConfig(**train), int(raw["corpus_chars"]), Path(raw["result"])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="potluck_lab.demo.worker")
    parser.add_argument("--phase", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one thread per worker, the 1-worker baseline too
    config, corpus_chars, result_path = read_phase(args.phase)
    text = load_corpus(corpus_chars, config.seed)
    cohort = potluck.init()
    try:
        result = train_worker(cohort, text, config)
        if cohort.rank == 0:
            torch.save(asdict(result), result_path)
    finally:
        cohort.close()


if __name__ == "__main__":
    main()
