"""The WAN bench's workload: the demo's char transformer on windows of stdlib source.

``Windows`` is a dataset of fixed context windows (a seeded table of start positions),
so every contender, torch DDP or potluck, trains on the same global batches through a
``DataCursor``; ``eval_batch`` is a held-out batch of windows from the corpus's tail.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from potluck_lab.models import CharTransformer, ModelConfig
from potluck_lab.text import Vocabulary, load_corpus

CONTEXT = 64
WINDOWS = 200_000
EVAL = 256  # held-out windows


class Windows(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i: ``(x, y)``, ``CONTEXT`` characters and the next ones, from a seeded start."""

    def __init__(self, corpus_chars: int) -> None:
        text = load_corpus(corpus_chars, seed=0)
        self.vocab = Vocabulary.from_text(text)
        self.tokens = self.vocab.encode(text)
        train_end = int(len(self.tokens) * 0.9)  # the tail is held out
        self.train_end = train_end
        gen = torch.Generator().manual_seed(2)
        self.starts = torch.randint(0, train_end - CONTEXT - 1, (WINDOWS,), generator=gen)

    @property
    def vocab_size(self) -> int:
        return self.vocab.size

    def __len__(self) -> int:
        return WINDOWS

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = int(self.starts[i])
        window = self.tokens[start:start + CONTEXT + 1]
        return window[:-1], window[1:]

    def batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.collate([self[i] for i in indices])

    @staticmethod
    def collate(items: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


def eval_batch(data: Windows) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    starts = torch.randint(data.train_end, len(data.tokens) - CONTEXT - 1, (EVAL,),
                           generator=gen)
    return _windows(data, starts)


def _windows(data: Windows, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    index = starts[:, None] + torch.arange(CONTEXT + 1)
    windows = data.tokens[index]
    return windows[:, :-1], windows[:, 1:]


def make_model(vocab_size: int) -> nn.Module:
    torch.manual_seed(0)
    return CharTransformer(ModelConfig(vocab_size=vocab_size, context=CONTEXT))
