"""What both of ``potluck bench cohort``'s jobs share: the corpus cut into windows, the
held-out batch, the model and its optimizer from the same arguments and seed, and the
JSON-lines log a worker writes (``cohort_job`` for potluck, ``cohort_ddp_job`` for
torchrun + DDP).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

SIGN_FLIP = -10.0  # the attacker's factor on what it sends (the byzantine bench's)


class Windows(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """``count`` windows of ``context + 1`` tokens at fixed offsets; item i is
    ``(inputs, targets, i)``."""

    def __init__(self, tokens: torch.Tensor, offsets: torch.Tensor, context: int) -> None:
        self.tokens, self.offsets, self.context = tokens, offsets, context

    def __len__(self) -> int:
        return self.offsets.numel()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        start = int(self.offsets[index])
        window = self.tokens[start: start + self.context + 1]
        return window[:-1], window[1:], index


def split(tokens: int, samples: int, held_out: int, context: int,
          seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Training offsets in the first 90% of the corpus, held-out ones in the rest."""
    cut = int(tokens * 0.9)
    gen = torch.Generator().manual_seed(seed)
    train = torch.randint(0, cut - context - 1, (samples,), generator=gen)
    test = torch.randint(cut, tokens - context - 1, (held_out,), generator=gen)
    return train, test


def add_task_args(parser: argparse.ArgumentParser) -> None:
    """The task's arguments, the same for both jobs."""
    parser.add_argument("--samples", type=int, default=3840)
    parser.add_argument("--held-out", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--corpus-chars", type=int, default=400_000)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)


@dataclass
class Task:
    """The training windows, the held-out batch, the model and its AdamW."""

    data: Windows
    held_x: torch.Tensor
    held_y: torch.Tensor
    net: torch.nn.Module
    optimizer: torch.optim.Optimizer


def build_task(args: argparse.Namespace) -> Task:
    """The task ``add_task_args``'s arguments describe, seeded alike on every worker."""
    from potluck_lab.models import CharTransformer, ModelConfig
    from potluck_lab.text import Vocabulary, load_corpus

    text = load_corpus(args.corpus_chars, args.seed)
    vocab = Vocabulary.from_text(text)
    tokens = vocab.encode(text)
    train_at, test_at = split(tokens.numel(), args.samples, args.held_out, args.context,
                              args.seed)
    held = Windows(tokens, test_at, args.context)
    torch.manual_seed(args.seed)
    net = CharTransformer(ModelConfig(vocab.size, args.context, args.d_model, args.layers))
    return Task(Windows(tokens, train_at, args.context),
                torch.stack([held[i][0] for i in range(len(held))]),
                torch.stack([held[i][1] for i in range(len(held))]),
                net, torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.01))


class JsonLog:
    """A worker's JSON lines: ``log(kind, **fields)`` writes one, with the wall clock."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a")

    def __call__(self, kind: str, **fields: Any) -> None:
        self._file.write(json.dumps({"kind": kind, "at": time.time(), **fields}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
