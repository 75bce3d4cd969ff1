"""``SpotRerun``: the I/O of the spot re-run under rounds (the rules: ``round_rerun.py``).

During a round, on every member (the sync strategy calls it: an ``InnerWatch``):

- at the round's start: copies of the replica (the global parameters; under Streaming
  DiLoCo with ``mixing > 0`` the member's own), its buffers, the inner optimizer's
  state and options (``inner_state.take``), and the random states (the CPU's, the
  accelerator's) its first local step draws dropout's masks from;
- after its first ``SpotCheck.steps`` local steps (or before its replica first changes
  mid-round, or at its last step): a copy of its parameters, the *snapshot*.

After a round commits, on every member alike (``check``):

1. whether the round is checked, from a hash of the round's reports (one in ``every``);
2. **commit**: one all-gather of 40 bytes a member: the blake2b digest and length of its
   payload (the inner state it started with, its own start where it has one, the
   snapshot), sent before anyone knows whom the round checks;
3. the target and checkers, from a hash of the reports and the commitments;
4. **send**: one all-to-all in which the target sends each checker its payload;
5. **re-run**: each checker checks the payload against its digest, then runs the
   target's first local steps itself (the batches the loader handed the target, read
   again; the user's ``loss``; the guard's clip and non-finite skip; a fresh optimizer
   of the user's class with the target's state and this member's own options) on a
   functional copy of the model, under ``torch.random.fork_rng``, and measures the
   relative L2 difference of its parameters' change to the target's;
6. **verdict**: one all-gather of the results (8 bytes a member), judged alike
   everywhere (``judge_rerun``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from potluck.collectives import settle
from potluck.errors import ConfigError
from potluck.group import ProcessGroupLike
from potluck.sync.round_sum import Piece
from potluck.trust.inner_state import (
    Taken,
    as_bytes,
    digest,
    optimizer_parameters,
    rerun_optimizer,
)
from potluck.trust.inner_state import take as take_state
from potluck.trust.inner_state import unpack as unpack_bytes
from potluck.trust.round_rerun import (
    COMMIT_BYTES,
    Pick,
    checked,
    judge_rerun,
    payload_bytes,
    payload_limit,
    pick,
    relative,
    stretch,
)
from potluck.trust.spot import SpotCheck
from potluck.trust.verdict import Finding

log = logging.getLogger(__name__)

# a member's random states in its payload, laid out alike on every device: the CPU's
# generator, a word saying whether an accelerator's follows (1) or not (0), its 16 bytes
CPU_RNG_BYTES = torch.get_rng_state().numel()
ACCEL_RNG_BYTES = 16
RNG_BYTES = CPU_RNG_BYTES + 8 + ACCEL_RNG_BYTES

ReadRange = Callable[[Sequence[tuple[int, int]]], list[Any]]  # (runs -> batches)


class _Round:
    """What this member kept of the round under way."""

    def __init__(self, start: list[torch.Tensor], buffers: dict[str, torch.Tensor],
                 inner: Taken, rng: torch.Tensor, counted: int) -> None:
        self.start, self.buffers, self.inner, self.counted = start, buffers, inner, counted
        self.rng = rng  # the random states its first local step drew from
        self.snapshot: list[torch.Tensor] | None = None


class SpotRerun:
    """Made by ``RoundTrustPart`` with ``Trust(spot_check=...)`` under rounds."""

    def __init__(self, config: SpotCheck, module: nn.Module,
                 optimizer: torch.optim.Optimizer, read_range: ReadRange, *,
                 global_batch: int, fragments: int, own_start: bool,
                 counted: Callable[[], int], clip_grad_norm: float | None = None) -> None:
        """``own_start``: each replica starts a round from its own parameters (Streaming
        DiLoCo with ``mixing > 0``), which then travel in the payload; ``counted()``:
        the members whose work counts when a round is handed out (the loader's local
        steps follow it)."""
        self.config, self._module, self._optimizer = config, module, optimizer
        self._read, self._clip = read_range, clip_grad_norm
        self._global_batch, self._fragments, self._own_start = global_batch, fragments, own_start
        self._counted = counted
        named = list(module.named_parameters())
        self._names = [name for name, _ in named]
        self._params = [p for _, p in named]
        where = {id(p): i for i, p in enumerate(self._params)}
        missing = [i for i, p in enumerate(optimizer_parameters(optimizer)) if id(p) not in where]
        if missing:
            raise ConfigError(f"SpotCheck under rounds: the optimizer holds {len(missing)} "
                              "parameter(s) the model does not; the re-run steps the model's")
        self._order = [where[id(p)] for p in optimizer_parameters(optimizer)]
        self._param_bytes = sum(p.numel() * p.element_size() for p in self._params)
        self._round: _Round | None = None
        self._parts: tuple[tuple[tuple[int, int], ...], ...] = ()
        self.checks: list[dict[str, Any]] = []  # each check: round, pick, payload, results
        self.sent_bytes = 0  # what this member sent for the checks, all together

    # ------------------------------------------------------------ the round (InnerWatch)

    def round_began(self) -> None:
        with torch.no_grad():
            start = [p.detach().clone() for p in self._params]
            buffers = {name: b.detach().clone() for name, b in self._module.named_buffers()}
        self._round = _Round(start, buffers, take_state(self._optimizer), self._rng_states(),
                             self._counted())

    def inner_step(self, done: int, final: bool) -> None:
        kept = self._round
        if kept is not None and kept.snapshot is None and (done >= self.config.steps or final):
            kept.snapshot = [p.detach().clone() for p in self._params]

    def keep(self, piece: Piece, owners: tuple[int, ...], wanted: tuple[int, ...],
             copies: Sequence[torch.Tensor]) -> None:
        """The round sum's call for each piece: the last one carries every member's parts."""
        if piece.parts:
            self._parts = piece.parts

    def forget(self) -> None:
        self._parts = ()

    # ------------------------------------------------------------ after the round

    def check(self, round_: int, reports: bytes, senders: Sequence[int],
              group: ProcessGroupLike, device: torch.device) -> list[Finding]:
        """The round's spot re-run, if it is checked; the findings (the same everywhere)."""
        parts = self._parts
        n, me = group.size(), group.rank()
        if not checked(round_, reports, self.config.every) or len(senders) < 2 \
                or len(parts) != n:  # (the same answer on every member)
            self._round, self._parts = None, ()
            return []
        payload = self.payload()
        committed = digest(payload)
        mine = torch.tensor([*(int.from_bytes(committed[i:i + 8], "little", signed=True)
                               for i in range(0, 32, 8)), payload.numel()],
                            dtype=torch.int64, device=device)
        table = [torch.empty_like(mine) for _ in range(n)]
        _all_gather(group, table, mine, "the spot re-run's commitments")
        rows = [t.cpu() for t in table]
        chosen = pick(round_, reports + b"".join(r.numpy().tobytes() for r in rows),
                      senders, self.config.checkers)
        assert chosen is not None
        size = int(rows[chosen.target][4])
        sent = 0 <= size <= payload_limit(self._param_bytes)
        got = self._send(chosen, payload, size, group, device) if sent else None
        result = math.nan
        if me in chosen.checkers:
            said = rows[chosen.target][:4].numpy().tobytes()
            result = math.inf if got is None else self.verify(got, said, parts[chosen.target])
        self._round, self._parts = None, ()
        results = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(n)]
        _all_gather(group, results, torch.tensor([result], dtype=torch.float64, device=device),
                    "the spot re-run's results")
        self.sent_bytes += (COMMIT_BYTES + 8) * (n - 1)
        values = [float(r.item()) for r in results]
        self.checks.append({"round": round_, "target": chosen.target,
                            "checkers": list(chosen.checkers), "payload": size,
                            "results": values})
        return judge_rerun(values, chosen, self.config.tolerance)

    def payload(self) -> torch.Tensor:
        """This member's payload of the round under way (uint8, CPU): its inner state at
        the start, its random states then, its own start (if any), its snapshot. Empty
        when it kept no round: then no layout matches, and a pick finds it off."""
        kept = self._round
        if kept is None or kept.snapshot is None:
            return torch.empty(0, dtype=torch.uint8)
        start = kept.start if self._own_start else []
        return as_bytes([t for _, _, t in kept.inner.tensors] + [kept.rng] + start
                        + kept.snapshot)

    def _send(self, chosen: Pick, payload: torch.Tensor, size: int, group: ProcessGroupLike,
              device: torch.device) -> torch.Tensor | None:
        """The target's payload, on each checker (None elsewhere)."""
        me, n = group.rank(), group.size()
        target = me == chosen.target
        out = [size if target and r in chosen.checkers else 0 for r in range(n)]
        into = [size if me in chosen.checkers and r == chosen.target else 0 for r in range(n)]
        send = (payload.to(device).repeat(len(chosen.checkers)) if target and size
                else torch.empty(0, dtype=torch.uint8, device=device))
        if send.numel() != sum(out):  # (the target's own commitment said otherwise)
            send = torch.zeros(sum(out), dtype=torch.uint8, device=device)
        received = torch.empty(sum(into), dtype=torch.uint8, device=device)
        self.sent_bytes += send.numel()
        settle(lambda: group.alltoall_base(received, send, into, out),  # type: ignore[attr-defined]
               group, "the spot re-run's payload")
        return received.cpu() if me in chosen.checkers else None

    def verify(self, got: torch.Tensor, said: bytes,
               parts: Sequence[tuple[int, int]]) -> float:
        """A checker's result for the target's payload ``got`` (uint8, CPU), committed
        as ``said`` (its digest), whose parts of the round are ``parts``: the relative
        L2 difference of its parameters' change to this member's re-run of its first
        local steps (inf: the payload is not what the target committed, or not laid out
        as this member's; NaN: this member kept no round start)."""
        kept = self._round
        if kept is None:
            log.warning("spot re-run: this checker kept no round start")
            return math.nan
        if digest(got) != said:
            return math.inf
        like = [t for _, _, t in kept.inner.tensors] + [kept.rng]
        starts = list(kept.start) if self._own_start else []
        if got.numel() != payload_bytes(self._param_bytes, kept.inner.nbytes + RNG_BYTES,
                                        self._own_start):
            return math.inf
        values = unpack_bytes(got, like + starts + list(kept.start))
        state, rng = values[:len(like) - 1], values[len(like) - 1]
        start = values[len(like):len(like) + len(starts)] if self._own_start else kept.start
        theirs = values[len(like) + len(starts):]
        ranges = stretch(parts, self._global_batch, kept.counted, self.config.steps,
                         self._fragments)
        mine = self._steps(start, kept, state, ranges, rng)
        if mine is None:  # (random states no generator takes: not what an honest member sends)
            return math.inf
        diff = moved = 0.0
        for param, a, b, s in zip(self._params, theirs, mine, start, strict=True):
            if param.requires_grad:
                diff += float((a.double() - b.double()).pow(2).sum())
                moved += float((b.double() - s.double()).pow(2).sum())
        log.debug("spot re-run over %d steps: %.3g", len(ranges), relative(diff, moved))
        return relative(diff, moved)

    def _rng_states(self) -> torch.Tensor:
        """The random states a local step draws from (dropout's masks), ``RNG_BYTES``:
        the CPU's, and the model's accelerator's where it has one of 16 bytes."""
        device = self._params[0].device if self._params else torch.device("cpu")
        accel = torch.zeros(ACCEL_RNG_BYTES, dtype=torch.uint8)
        carried = 0
        if device.type == "cuda":
            state = torch.cuda.get_rng_state(device)
            if state.numel() == ACCEL_RNG_BYTES:
                accel, carried = state.cpu(), 1
        flag = torch.tensor([carried], dtype=torch.int64).view(torch.uint8)
        return torch.cat([torch.get_rng_state(), flag, accel])

    def _steps(self, start: Sequence[torch.Tensor], kept: _Round,
               state: Sequence[torch.Tensor], ranges: Sequence[tuple[int, int]],
               rng: torch.Tensor) -> list[torch.Tensor] | None:
        """The parameters after the local steps on ``ranges``, from ``start``, drawing
        from the target's random states ``rng`` (as ``_rng_states``; its accelerator's
        only where both have one). None: states no generator takes."""
        leaves = [s.detach().clone().requires_grad_(p.requires_grad)
                  for s, p in zip(start, self._params, strict=True)]
        optimizer = rerun_optimizer(self._optimizer, [leaves[i] for i in self._order],
                                    kept.inner, state)
        buffers = {name: b.clone() for name, b in kept.buffers.items()}
        values = {**buffers, **dict(zip(self._names, leaves, strict=True))}
        module, trained = self._module, [leaf for leaf in leaves if leaf.requires_grad]

        def model(*args: Any, **kwargs: Any) -> Any:
            return torch.func.functional_call(module, values, args, kwargs)

        devices = [leaves[0].device] if leaves and leaves[0].is_cuda else []
        with torch.random.fork_rng(devices=devices):
            try:
                torch.set_rng_state(rng[:CPU_RNG_BYTES].clone())
                if devices and int(rng[CPU_RNG_BYTES:CPU_RNG_BYTES + 8].view(torch.int64)):
                    torch.cuda.set_rng_state(rng[CPU_RNG_BYTES + 8:].clone(), devices[0])
            except RuntimeError:
                return None
            for a, b in ranges:
                with torch.enable_grad():
                    loss = self.config.loss(model, self._read([(a, b)])[0])
                    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
                        raise ConfigError(f"SpotCheck's loss(model, batch) returned "
                                          f"{type(loss).__name__}; it must return the "
                                          "scalar loss the loop calls backward() on")
                    grads = torch.autograd.grad(loss, trained, allow_unused=True)
                self._apply(optimizer, trained, grads)
        return [leaf.detach() for leaf in leaves]

    def _apply(self, optimizer: torch.optim.Optimizer, trained: Sequence[torch.Tensor],
               grads: Sequence[torch.Tensor | None]) -> None:
        """One step as the guard takes it: skip a non-finite one, clip, step."""
        for leaf, grad in zip(trained, grads, strict=True):
            leaf.grad = grad
        given = [g for g in grads if g is not None]
        total = torch.nn.utils.get_total_norm(given) if given else torch.zeros(())
        if math.isfinite(float(total)):
            if self._clip is not None and given:
                torch.nn.utils.clip_grads_with_norm_(trained, self._clip, total)
            optimizer.step()
        for leaf in trained:
            leaf.grad = None


def _all_gather(group: ProcessGroupLike, into: list[torch.Tensor], mine: torch.Tensor,
                what: str) -> None:
    settle(lambda: group.allgather([into], [mine]), group, what)


__all__ = ["COMMIT_BYTES", "SpotRerun"]
