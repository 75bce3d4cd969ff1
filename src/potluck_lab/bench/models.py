"""Benchmark models of about 10M parameters: a deep MLP and a small transformer LM."""

from __future__ import annotations

import torch
from torch import nn


def mlp(width: int = 2048, depth: int = 3, io: int = 512) -> nn.Module:
    """io -> width -> ... -> io with GELU; about 10.5M parameters at the defaults."""
    layers: list[nn.Module] = [nn.Linear(io, width), nn.GELU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.GELU()]
    layers.append(nn.Linear(width, io))
    return nn.Sequential(*layers)


class TinyLM(nn.Module):
    """A causal transformer language model; about 10M parameters at the defaults."""

    def __init__(self, vocab: int = 4096, d_model: int = 256, layers: int = 10,
                 heads: int = 4, context: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.zeros(context, d_model))
        block = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.mask: torch.Tensor
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        h = self.embed(tokens) + self.position[:t]
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        logits: torch.Tensor = self.head(self.norm(h))
        return logits


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
