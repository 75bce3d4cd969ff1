"""The lab's models, one module for every bench, demo and test that trains one.

- ``mlp(sizes, activation)``: linear layers through ``sizes`` with an activation
  between them; each bench's MLP is one call. ``tiny_mlp``: 8 -> 32 -> 32 -> 4 in
  float64, the exact-equality tests' model. ``wide_mlp``: about 10M parameters.
- ``TinyLM``: a causal transformer language model of about 10M parameters.
- ``CharTransformer``: the demo's character-level transformer. Pre-norm blocks (causal
  self-attention, then a 4x MLP), learned positions, and an output head tied to the
  token embedding. Small enough that a few hundred steps on one CPU core visibly learn
  the shape of Python source.

Layers are built in float32 from torch's generator (seeded first when ``seed`` is
given) and converted to ``dtype`` after: the same weights on every rank and machine.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from potluck.errors import ConfigError


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    context: int = 64
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}; "
                "each head needs d_model / n_heads channels"
            )
        for name in ("vocab_size", "context", "d_model", "n_layers", "n_heads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        shape = (batch, time, self.n_heads, channels // self.n_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        merged: torch.Tensor = self.proj(out.transpose(1, 2).reshape(batch, time, channels))
        return merged


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model)
        self.attn = SelfAttention(config)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model),
            nn.GELU(),
            nn.Linear(4 * config.d_model, config.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class CharTransformer(nn.Module):
    """Maps ``(batch, time)`` token ids to ``(batch, time, vocab)`` next-token logits."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.token = nn.Embedding(config.vocab_size, config.d_model)
        self.position = nn.Embedding(config.context, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.head.weight = self.token.weight  # tied: fewer parameters, faster start
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        time = tokens.shape[1]
        if time > self.config.context:
            raise ConfigError(
                f"input of {time} tokens exceeds the model's context of "
                f"{self.config.context}; crop the input to the last {self.config.context}"
            )
        x = self.token(tokens) + self.position(torch.arange(time, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def language_model_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of next-token predictions (nats per character)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@torch.no_grad()
def generate(
    model: CharTransformer,
    prompt: torch.Tensor,
    length: int,
    *,
    temperature: float = 0.8,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``prompt`` (1-D token ids) continued by ``length`` sampled tokens."""
    if temperature <= 0:
        raise ConfigError(f"temperature must be > 0, got {temperature}; 0.8 is typical")
    was_training = model.training
    model.eval()
    tokens = prompt.clone()
    for _ in range(length):
        window = tokens[-model.config.context :].unsqueeze(0)
        logits = model(window)[0, -1] / temperature
        probs = torch.softmax(logits, dim=-1)
        nxt = torch.multinomial(probs, 1, generator=generator)
        tokens = torch.cat([tokens, nxt])
    model.train(was_training)
    return tokens


def mlp(sizes: Sequence[int], activation: Callable[[], nn.Module] = nn.Tanh, *,
        seed: int | None = None, dtype: torch.dtype | None = None) -> nn.Sequential:
    """``Linear(sizes[0], sizes[1])``, ``activation()``, ... ``Linear(sizes[-2],
    sizes[-1])``; ``seed``: ``torch.manual_seed(seed)`` first."""
    if seed is not None:
        torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for inputs, outputs in itertools.pairwise(sizes):
        layers += [nn.Linear(inputs, outputs), activation()]
    net = nn.Sequential(*layers[:-1])
    return net if dtype is None else net.to(dtype)


def tiny_mlp(seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Sequential:
    """8 -> 32 -> 32 -> 4 with tanh: small enough that float64 runs compare to 1e-9."""
    return mlp([8, 32, 32, 4], seed=seed, dtype=dtype)


def wide_mlp(width: int = 2048, depth: int = 3, io: int = 512) -> nn.Sequential:
    """io -> width -> ... -> io with GELU; about 10.5M parameters at the defaults."""
    return mlp([io, *[width] * depth, io], nn.GELU)


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
