"""The trust bench's floor: what the step's collectives cost alone, in raw torch.

One rank of ``potluck bench byzantine``'s floor timing: the trust bench's model and data
(``byzantine_job``), each rank's part of the global batch, SGD with momentum, and the
gradient (one flat buffer, as one bucket) synchronized either by one all-reduce (the
plain mean's structure) or by two all-to-alls with a plain mean of the owner's slice in
between (trust's structure: each owner gets every rank's copy of its slice, then hands
every rank its result). No potluck code in the step: the difference between the two is
what the design's communication costs on the machine, and the gap from there to
potluck's own step times is potluck's work, not the wire's.

The ``robust*`` modes add, in the same raw torch, the least work trust's checks need,
to tell what the design costs on the machine from what potluck's code adds to it:

- ``robust``: a fingerprint of the parameters (two wrapping 32-bit sums a tensor)
  rides with each rank's copy in the first all-to-all; the owner aggregates its slice
  by CenteredClip's clean case (the lower median; each copy's distance from it; the
  mean; each copy's distance from that, all within the radius) and takes the replay
  watch's sums of each copy; the aggregate and the distances go back in the second
  all-to-all, and every rank takes a keyed BLAKE3 digest of each other owner's row as
  handed out;
- ``robust_audit``: also, every step, one owner's slice audited: every rank's copy of
  it rides in the second all-to-all (as trust's does), every rank digests the copies
  (the audited owner those it received), and every other owner recomputes that
  owner's aggregate and compares it with the one handed out;
- ``robust_spot1`` and ``robust_spot3``: also, one step in ``SPOT_EVERY``, one rank's
  gradient recomputed on its own samples and compared on the checker's slice, by one
  other owner or by all three others (as trust's spot checks do; a whole backward,
  where trust's stops at the first layer it needs), from a copy of the parameters the
  checkers take before the update on that step only (as trust's do; into a model kept
  between steps, where trust allocates its copy).

The kernels are trust's own (``lower_median``, ``Fingerprints``, ``word_sums``,
``hash64``): the only potluck code in the step. Every check takes the clean case
(nobody is clipped, nothing differs; a check that finds otherwise raises): the floor
times the work, not the verdicts. It leaves out
what only potluck's bookkeeping does: the reports' words, their decoding and digests,
the verdict, the ledger.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from potluck.trust.aggregate import lower_median
from potluck.trust.fingerprint import Fingerprints, hash64, word_sums
from potluck_lab.bench.byzantine_job import GLOBAL_BATCH, HIDDEN, SPOT_EVERY, data, model

MODES = ("allreduce", "alltoall", "robust", "robust_audit", "robust_spot1", "robust_spot3")
TAU_SCALE = 2.0  # CenteredClip's default
_KEY = 1  # (trust's key is drawn after the step; its value costs nothing)


def run_floor(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec``: mode (``MODES``), steps, hidden (the model's width). Runs on the
    default group (``potluck.testing.run_ranks(init_group=True)``); returns the step
    times (seconds) and the parameters at the end, flat."""
    mode, steps = spec["mode"], int(spec["steps"])
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    train, _ = data(steps)
    net = model(0, spec.get("hidden", HIDDEN))
    params = list(net.parameters())
    optimizer = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    numel = sum(p.numel() for p in params)
    piece = -(-numel // world_size)
    flat = torch.zeros(piece * world_size)
    received = torch.empty_like(flat)
    robust = (_Robust(mode, rank, world_size, params, model(0, spec.get("hidden", HIDDEN)),
                      train.tensors) if mode.startswith("robust") else None)
    part = GLOBAL_BATCH // world_size
    x_all, y_all = train.tensors
    times: list[float] = []
    for step in range(steps):
        start = step * GLOBAL_BATCH + rank * part
        xb, yb = x_all[start:start + part], y_all[start:start + part]
        began = time.perf_counter()
        optimizer.zero_grad()
        if robust is not None:
            robust.snapshot(step)
        nn.functional.cross_entropy(net(xb), yb).backward()  # type: ignore[no-untyped-call]
        torch.cat([_grad(p).reshape(-1) for p in params], out=flat[:numel])
        if robust is not None:
            robust.synchronize(flat, step)
        elif mode == "allreduce":
            dist.all_reduce(flat)
            flat.div_(world_size)
        else:
            dist.all_to_all_single(received, flat)
            mean = received.view(world_size, piece).mean(0)
            dist.all_to_all_single(flat, mean.repeat(world_size))
        offset = 0
        for p in params:
            _grad(p).view(-1).copy_(flat[offset:offset + p.numel()])
            offset += p.numel()
        optimizer.step()
        times.append(time.perf_counter() - began)
    return {"times": times, "parameters": torch.cat([p.detach().reshape(-1) for p in params])}


class _Robust:
    """One rank's synchronization in the robust modes (the module's docstring), with
    its buffers kept from step to step, as trust keeps its own."""

    def __init__(self, mode: str, rank: int, world_size: int, params: Sequence[torch.Tensor],
                 shadow: nn.Module, samples: tuple[torch.Tensor, ...]) -> None:
        self.rank, self.n, self.params, self.shadow = rank, world_size, list(params), shadow
        self.audit = mode != "robust"
        self.checkers = {"robust_spot1": 1, "robust_spot3": 3}.get(mode, 0)
        self.numel = sum(p.numel() for p in params)
        self.piece = piece = -(-self.numel // world_size)
        self.x_all, self.y_all = samples
        self.prints = Fingerprints()
        self.lanes = torch.empty(world_size, piece + 2)  # the copy, then the fingerprint
        self.arrived = torch.empty_like(self.lanes)
        self.extra = world_size + (piece if self.audit else 0)  # distances, audit copy
        self.back = torch.empty(world_size, piece + self.extra)

    def snapshot(self, step: int) -> None:
        """The step's parameters, before the update, on a step this rank checks (trust
        knows which once backward's exchange ends, before the update)."""
        if self._checks(step):
            with torch.no_grad():
                torch._foreach_copy_(list(self.shadow.parameters()), self.params)

    def _checks(self, step: int) -> bool:
        """Whether this rank spot-checks ``step``'s target (``step // SPOT_EVERY`` round
        the ranks): one of the first ``checkers`` of the others, on a checked step."""
        if not self.checkers or step % SPOT_EVERY:
            return False
        target = (step // SPOT_EVERY) % self.n
        return self.rank in [r for r in range(self.n) if r != target][:self.checkers]

    def synchronize(self, flat: torch.Tensor, step: int) -> None:
        """``flat`` (this rank's gradient, padded to the slices) becomes the aggregate."""
        n, piece, rank = self.n, self.piece, self.rank
        owner = step % n  # audited
        folded = self.prints(self.params)
        self.lanes[:, :piece] = flat.view(n, piece)
        self.lanes[:, piece:] = torch.tensor([folded >> 32, folded & 0xFFFFFFFF])
        dist.all_to_all_single(self.arrived, self.lanes)
        copies = self.arrived[:, :piece]
        mine, d2 = _clip_clean(copies)
        word_sums(copies, dim=1).tolist()  # the replay watch's sums
        parts = [mine, d2]
        if self.audit:  # this rank's copy of the audited owner's slice rides along
            parts.append(flat[owner * piece:(owner + 1) * piece])
        dist.all_to_all_single(self.back, torch.cat(parts).repeat(n))
        rows = self.back
        for other in range(n):  # each other owner's row as handed out, keyed
            if other != rank:
                hash64([rows[other]], _KEY)
        if self.audit:
            self._audit(rows, copies, owner)
        flat.view(n, piece).copy_(rows[:, :piece])
        if self._checks(step):
            self._spot(copies, step)

    def _audit(self, rows: torch.Tensor, copies: torch.Tensor, owner: int) -> None:
        """Every rank digests the audit's copies (the audited owner those it received);
        the other owners recompute its aggregate and compare."""
        piece, extra = self.piece, self.n
        carried = rows[:, piece + extra:]  # every rank's copy of the owner's slice
        if self.rank == owner:
            hash64(list(copies), _KEY)
            return
        hash64(list(carried), _KEY)
        again, _ = _clip_clean(carried)
        handed = rows[owner, :piece]
        if not float((again - handed).norm()) <= 1e-5 * float(handed.norm()):
            raise RuntimeError(f"the floor's audit of rank {owner} found its aggregate off")

    def _spot(self, copies: torch.Tensor, step: int) -> None:
        """This checker's spot check of the step's target (``_checks``): its gradient
        recomputed from the snapshot on its own samples and compared, on this rank's
        slice, with the copy it sent."""
        target = (step // SPOT_EVERY) % self.n
        part = GLOBAL_BATCH // self.n
        start = step * GLOBAL_BATCH + target * part
        for p in self.shadow.parameters():
            p.grad = None
        loss = nn.functional.cross_entropy(self.shadow(self.x_all[start:start + part]),
                                           self.y_all[start:start + part])
        loss.backward()  # type: ignore[no-untyped-call]
        again = torch.cat([_grad(p).reshape(-1) for p in self.shadow.parameters()])
        ours = again[self.rank * self.piece:min((self.rank + 1) * self.piece, self.numel)]
        sent = copies[target, :ours.numel()]
        if not float((ours - sent).norm()) <= 1e-3 * float(sent.norm()):
            raise RuntimeError(f"the floor's spot check of rank {target} found its copy off")


def _clip_clean(copies: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CenteredClip's clean case on equal weights: the weighted mean, once every copy is
    found within the clip radius of it (the floor takes no other case), and each copy's
    squared distance to it."""
    center = lower_median(copies)  # (torch.median along dim 0 takes 30 times as long)
    spread = sorted((copies - center).norm(dim=1).tolist())
    tau = TAU_SCALE * spread[(len(spread) - 1) // 2]
    mean = copies.mean(0)
    offsets = (copies - mean).norm(dim=1)
    if float(offsets.max()) > tau:
        raise RuntimeError("the floor's clean step clipped a copy")
    return mean, offsets.square()


def _grad(param: torch.Tensor) -> torch.Tensor:
    if param.grad is None:  # every parameter of the bench's MLP is used
        raise RuntimeError("the floor's model has a parameter without a gradient")
    return param.grad
