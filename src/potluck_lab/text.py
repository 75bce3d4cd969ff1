"""The demo's corpus and batches: Python standard-library source, every machine has it.

The corpus is a deterministic subset of the top-level ``*.py`` files of the running
interpreter's stdlib (sorted, shuffled with the seed, read until the byte budget).
Characters are the tokens. Each global step draws ``global_batch`` windows from a
generator seeded with (seed, step); rank r trains on the r-th equal share of them, so
N workers and one worker see exactly the same samples at every step.
"""

from __future__ import annotations

import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from potluck.errors import ConfigError


@dataclass(frozen=True)
class Vocabulary:
    """The characters of the corpus, sorted; a token is an index into ``chars``."""

    chars: str

    @classmethod
    def from_text(cls, text: str) -> Vocabulary:
        return cls("".join(sorted(set(text))))

    @property
    def size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        # Vectorized: a few MB encode in milliseconds, not seconds of a Python loop.
        table = np.array([ord(char) for char in self.chars], dtype=np.uint32)
        codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
        ids = np.searchsorted(table, codes).clip(0, max(len(table) - 1, 0))
        unknown = codes[table[ids] != codes] if len(table) else codes
        if unknown.size:
            chars = sorted({chr(code) for code in unknown[:100].tolist()})
            raise ConfigError(
                f"characters {chars[:5]!r} are not in the vocabulary; encode only text "
                "drawn from the corpus the vocabulary was built from"
            )
        return torch.from_numpy(ids.astype(np.int64))

    def decode(self, tokens: torch.Tensor | list[int]) -> str:
        ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens
        return "".join(self.chars[i] for i in ids)


def stdlib_dir() -> Path:
    """Where the running interpreter's standard library lives."""
    return Path(sysconfig.get_paths()["stdlib"])


def load_corpus(max_chars: int, seed: int, root: Path | None = None) -> str:
    """Up to ``max_chars`` characters of stdlib source, the same for the same seed."""
    if max_chars < 1:
        raise ConfigError(f"corpus size must be at least 1 character, got {max_chars}")
    root = stdlib_dir() if root is None else root
    files = sorted(path for path in root.glob("*.py") if path.is_file())
    if not files:
        raise ConfigError(
            f"found no *.py files in {root} (the stdlib directory); the demo trains on "
            "the interpreter's own source: run it with a full CPython install"
        )
    random.Random(seed).shuffle(files)
    parts: list[str] = []
    total = 0
    for path in files:
        if total >= max_chars:
            break
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
    return "".join(parts)[:max_chars]


def batch_offsets(
    step: int, seed: int, n_tokens: int, context: int, global_batch: int
) -> torch.Tensor:
    """Start positions of the ``global_batch`` windows of ``step`` (same on every rank)."""
    if n_tokens < context + 2:
        raise ConfigError(
            f"the corpus has {n_tokens} tokens but one sample needs context + 1 = "
            f"{context + 1}; use a larger corpus or a shorter context"
        )
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, n_tokens - context - 1, (global_batch,), generator=generator)


def rank_share(offsets: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s equal, contiguous share of a step's windows."""
    global_batch = offsets.numel()
    if global_batch % world_size:
        raise ConfigError(
            f"global batch {global_batch} does not split evenly over {world_size} "
            "workers; choose a batch size that is a multiple of the worker count"
        )
    local = global_batch // world_size
    return offsets[rank * local : (rank + 1) * local]


def make_batch(
    tokens: torch.Tensor, offsets: torch.Tensor, context: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-character targets, both ``(len(offsets), context)``."""
    index = offsets[:, None] + torch.arange(context + 1)
    windows = tokens[index]
    return windows[:, :-1], windows[:, 1:]
