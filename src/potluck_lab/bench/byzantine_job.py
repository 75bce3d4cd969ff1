"""One rank of the trust bench: 4 workers, one of them attacking (``byzantine.py``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from potluck_lab.attacks import Attack, flip_bit, plain_mean
from potluck_lab.models import mlp

if TYPE_CHECKING:
    from potluck.cohort import Cohort

ATTACKER = 3  # rank 0, whose replica is evaluated, is honest
GLOBAL_BATCH = 256
FEATURES, CLASSES, HIDDEN = 64, 8, 256  # 84k parameters
WIDE = 1024  # the hidden width of the second timing: 1.1M parameters
HOLDOUT = 1024
SPOT_EVERY = 2  # the bench's trust contender spot-checks one step in 2 on average


def data(steps: int) -> tuple[torch.utils.data.TensorDataset, tuple[torch.Tensor, torch.Tensor]]:
    """A teacher network's labels on Gaussian inputs (the same for every run)."""
    gen = torch.Generator().manual_seed(1234)
    teacher = torch.randn(FEATURES, CLASSES, generator=gen)
    x = torch.randn(steps * GLOBAL_BATCH + HOLDOUT, FEATURES, generator=gen)
    y = (x @ teacher + 0.5 * torch.randn(len(x), CLASSES, generator=gen)).argmax(1)
    train = torch.utils.data.TensorDataset(x[HOLDOUT:], y[HOLDOUT:])
    return train, (x[:HOLDOUT], y[:HOLDOUT])


def model(seed: int, hidden: int = HIDDEN) -> nn.Module:
    return mlp([FEATURES, hidden, hidden, CLASSES], nn.ReLU, seed=seed)


def spot_loss(net: Any, batch: Any) -> torch.Tensor:
    """The loop's loss, for spot checks."""
    return nn.functional.cross_entropy(net(batch[0]), batch[1])


def join(rank: int, world_size: int, port: int) -> Cohort:
    """This rank's cohort on loopback (``potluck.testing.run_ranks`` starts the ranks)."""
    import potluck
    from potluck.env import WorkerEnv

    return potluck.init(env=WorkerEnv(rank=rank, world_size=world_size,
                                      master_addr="127.0.0.1", master_port=port,
                                      source="torchrun"), timeout=60.0)


def run_rank(rank: int, world_size: int, port: int, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec``: attack (a name or "none"), trust (bool), seed, steps, wrap (bool: put
    the attack wrapper in even with no attack; False for the timing runs), spot (spot
    check every K steps under trust; 0: none), hidden (the model's width; default
    ``HIDDEN``), audit_every (``Trust``'s; default 1)."""
    import logging

    import potluck

    logging.getLogger("potluck").setLevel(logging.ERROR)  # the figures say what happened
    cohort = join(rank, world_size, port)
    train, (hx, hy) = data(spec["steps"])
    net = model(spec["seed"], spec.get("hidden", HIDDEN))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    every = spec.get("spot", 0)
    trust = potluck.Trust(spot_check=potluck.trust.SpotCheck(spot_loss, every=every)
                          if every else None, audit_every=spec.get("audit_every", 1))
    wrapped, opt, loader = potluck.prepare(
        net, optimizer, train, global_batch=GLOBAL_BATCH, seed=spec["seed"], cohort=cohort,
        trust=trust if spec["trust"] else None)
    part = opt.part(potluck.trust.TrustPart)
    attack = None
    if spec["wrap"]:
        inner = part.exchange if part is not None else plain_mean
        attack = Attack(inner, spec["attack"], rank == ATTACKER, seed=spec["seed"])
        wrapped.register_comm_hook(None, attack)
    loss_fn = nn.CrossEntropyLoss()
    times: list[float] = []
    for xb, yb in loader:
        started = time.perf_counter()
        opt.zero_grad()
        loss_fn(wrapped(xb), yb).backward()
        opt.step()
        times.append(time.perf_counter() - started)
        if spec["attack"] == "bit_flip" and rank == ATTACKER:
            flip_bit(net, opt.steps)
        if opt.steps >= spec["steps"]:
            break
    with torch.no_grad():
        final = float(loss_fn(net(hx), hy))
    events = part.events if part is not None else []
    opt.finish()
    return {"loss": final, "times": times, "events": events,
            "start": attack.starts_at() if attack is not None else 1}
