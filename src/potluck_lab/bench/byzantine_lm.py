"""The trust bench's second clean workload: a small character transformer, one sample
per worker a step, on real text (``corpus.txt``: the project's own docs).

Honest copies of such small batches are now and then far from the center: a window of
text unlike the rest (a table, a code block) gives a gradient far from the others'. The
far rule must not quarantine them (``potluck.trust.far``); the bench's MLP, with 64
samples a worker, hardly shows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from potluck_lab.bench.byzantine_job import join
from potluck_lab.models import TinyLM

CORPUS = Path(__file__).with_name("corpus.txt")
CONTEXT = 32
STEPS = 64


def windows(world_size: int, steps: int, seed: int) -> torch.utils.data.TensorDataset:
    """``world_size * steps`` windows of the corpus at random places (the seed's)."""
    text = torch.tensor([min(ord(c), 127) for c in CORPUS.read_text(encoding="utf-8")],
                        dtype=torch.long)
    starts = torch.randint(0, len(text) - CONTEXT - 1, (world_size * steps,),
                           generator=torch.Generator().manual_seed(seed))
    rows = torch.stack([text[s:s + CONTEXT + 1] for s in starts.tolist()])
    return torch.utils.data.TensorDataset(rows[:, :-1], rows[:, 1:])


def run_rank(rank: int, world_size: int, port: int, seed: int,
             steps: int = STEPS) -> dict[str, Any]:
    """Train with ``Trust()``, one sample a worker a step; who was quarantined, the far
    steps seen (member, step), the far steps in a row that quarantine at the end."""
    import logging

    import potluck
    from potluck.trust.verdict import FAR

    logging.getLogger("potluck").setLevel(logging.ERROR)
    cohort = join(rank, world_size, port)
    torch.manual_seed(0)
    net = TinyLM(vocab=128, d_model=64, layers=2, heads=4, context=CONTEXT)
    wrapped, opt, loader = potluck.prepare(
        net, torch.optim.AdamW(net.parameters(), lr=1e-3), windows(world_size, steps, seed),
        global_batch=world_size, cohort=cohort, trust=potluck.Trust())
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(wrapped(xb).flatten(0, 1), yb.flatten())
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    part = opt.part(potluck.trust.TrustPart)
    assert part is not None  # (prepare(trust=...) adds it)
    out = {"quarantined": list(part.quarantined), "steps": opt.steps,
           "far": [(e.member, e.step) for e in part.strikes.evidence if e.kind == FAR],
           "needed": part.strikes.far_needed()}
    opt.finish()
    return out
