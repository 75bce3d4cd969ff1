"""One rank of ``potluck bench wan``: a contender trained on the demo's char transformer.

Started by the bench inside a network namespace (``ip netns exec``), one process per
rank and contender, with the job's address in ``MASTER_ADDR``/``MASTER_PORT`` and
``GLOO_SOCKET_IFNAME`` set to the namespace's veth. Every contender trains on the same
global batches (a ``DataCursor`` over a fixed table of windows) and evaluates the same
held-out batch; the evaluation's time is left out of the wall clock. Rank 0 (and, for
the busy figure, every rank) writes a JSON of what it saw.

Contenders: ``ddp``, ``ddp-fp16`` and ``ddp-powersgd`` (torch DDP, with torch's own
hooks), ``diloco`` and ``diloco-int8`` (``potluck.prepare(sync=DiLoCo(...))``), and
``diloco-fixed`` (the same with ``adaptive=False``: every worker takes H local steps),
``streaming-int8`` (``StreamingDiLoCo(H, 4, codec=Int8Blockwise())``: four fragments
in turn, each overlapped with the following local steps), ``localsgd-int8``
(``LocalSGD(H, codec=Int8Blockwise())``: DiLoCo whose outer step is the plain average),
and ``localsgd-int4`` (``LocalSGD(H // 2, codec=Int4Blockwise())``: twice the syncs at
half the bytes each, so about int8's bytes at H); ``localsgd`` (``LocalSGD(H)`` without a
codec) is for loopback sweeps.

The learning rate is constant unless ``--warmup W`` (a linear ramp over the first W
steps) or ``--decay`` (a cosine from the rate down to a tenth of it at ``--batches``) is
given, for sweeps; the bench itself uses neither. The schedule's clock is the optimizer
steps this rank took: DDP's steps, or potluck's local steps, each about
``global_batch / N`` samples on every worker, so about one global batch's worth of the
run (with local steps set by speed, a worker that takes more local steps in a round
runs ahead of the other on the schedule by that difference).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTENDERS = ("ddp", "ddp-fp16", "ddp-powersgd", "diloco", "diloco-int8", "diloco-fixed",
              "streaming-int8", "localsgd-int8", "localsgd-int4", "localsgd")
STREAMING_FRAGMENTS = 4


@dataclass(frozen=True)
class JobArgs:
    contender: str
    batches: int  # global batches to train (a DDP measure-only run stops earlier)
    global_batch: int
    inner_steps: int
    eval_every: int  # global batches between evaluations (DDP; DiLoCo: every round)
    lr: float
    out: Path
    measure_steps: int  # > 0: stop after this many steps, no evaluation (step timing)
    corpus_chars: int
    outer: dict[str, Any] | None = None  # DiLoCo's outer-step settings given as flags
    sync_measure: float | None = None  # DiLoCo's measure, given as a flag
    seed: int = 1  # the data order's (the model's initial weights never change)
    warmup: int = 0  # steps of a linear ramp of the rate (0: none)
    decay: bool = False  # a cosine from the rate to a tenth of it at ``batches``


def _parse(argv: list[str]) -> JobArgs:
    p = argparse.ArgumentParser(prog="python -m potluck_lab.bench.wan_job")
    p.add_argument("--contender", choices=CONTENDERS, required=True)
    p.add_argument("--batches", type=int, required=True)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--inner-steps", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--lr", type=float, default=1.5e-3)  # bench.wan.LR
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--measure-steps", type=int, default=0)
    p.add_argument("--corpus-chars", type=int, default=400_000)
    p.add_argument("--seed", type=int, default=1, help="the data order's seed")
    p.add_argument("--warmup", type=int, default=0, metavar="W",
                   help="ramp the rate up linearly over the first W steps (default: none)")
    p.add_argument("--decay", action="store_true",
                   help="a cosine from the rate down to a tenth of it at --batches")
    p.add_argument("--outer-lr", type=float, help="DiLoCo's outer lr (default: DiLoCo's)")
    p.add_argument("--outer-momentum", type=float,
                   help="DiLoCo's outer momentum (0: plain SGD; default: DiLoCo's)")
    p.add_argument("--mixing", type=float, help="Streaming DiLoCo's merge weight")
    p.add_argument("--sync-measure", type=float,
                   help="an unmeasured round's even start (DiLoCo's measure; default its own)")
    a = p.parse_args(argv)
    outer = {k: v for k, v in (("outer_lr", a.outer_lr), ("outer_momentum", a.outer_momentum),
                               ("mixing", a.mixing)) if v is not None}
    if "outer_momentum" in outer:
        outer["nesterov"] = outer["outer_momentum"] > 0
    if outer and not a.contender.startswith(("diloco", "streaming")):
        p.error("--outer-lr, --outer-momentum and --mixing are for the diloco and "
                "streaming contenders")
    if "mixing" in outer and not a.contender.startswith("streaming"):
        p.error("--mixing is for the streaming contender")
    if a.sync_measure is not None and (a.contender.startswith("ddp")
                                       or a.contender == "diloco-fixed"):
        p.error("--sync-measure is for potluck's contenders with local steps by speed")
    if a.sync_measure is not None and not 0 <= a.sync_measure < 1:
        p.error(f"--sync-measure {a.sync_measure}: a fraction of a round in [0, 1)")
    if a.batches < 1:
        p.error(f"--batches {a.batches}: at least one global batch")
    if a.warmup < 0:
        p.error(f"--warmup {a.warmup}: a number of steps, 0 or more")
    return JobArgs(a.contender, a.batches, a.global_batch, a.inner_steps, a.eval_every, a.lr,
                   a.out, a.measure_steps, a.corpus_chars, outer or None, a.sync_measure,
                   a.seed, a.warmup, a.decay)


class Clock:
    """Wall time with pauses left out (evaluations)."""

    def __init__(self) -> None:
        self.start, self.paused = time.perf_counter(), 0.0

    def now(self) -> float:
        return time.perf_counter() - self.start - self.paused

    def pause(self) -> float:
        return time.perf_counter()

    def resume(self, since: float) -> None:
        self.paused += time.perf_counter() - since


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    from potluck.env import read_worker_env
    from potluck_lab.bench.wan_data import Windows, eval_batch, make_model

    data = Windows(args.corpus_chars)
    model = make_model(data.vocab_size)
    held_out = eval_batch(data)
    rank = read_worker_env().rank
    if args.contender.startswith("ddp"):
        result = _ddp(args, model, data, held_out)
    else:
        result = _diloco(args, model, data, held_out)
    result.update(rank=rank, contender=args.contender,
                  parameters=sum(p.numel() for p in model.parameters()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_name(f"{args.out.stem}-rank{rank}.json").write_text(json.dumps(result))
    return 0


def _evaluate(model: Any, held_out: Any) -> float:
    import torch

    x, y = held_out
    with torch.no_grad():
        logits = model(x)
        return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()))


def _loss(model: Any, x: Any, y: Any) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())


def _ddp(args: JobArgs, net: Any, data: Any, held_out: Any) -> dict[str, Any]:
    import gc

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    from potluck.data import DataCursor

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # torch's PowerSGD hook chains three all-reduces a bucket: the uncompressed tensors
    # (issued by the hook, on the autograd thread), then the Ps and then the Qs (each
    # issued from a callback of the one before, which on Gloo runs on the backend's
    # thread). With two buckets one rank can issue bucket 0's Ps before bucket 1's
    # first all-reduce and the other after it: the ranks' collectives no longer pair up
    # ("Received data size doesn't match expected size" in the first compressed step).
    # One bucket keeps one chain a step, in order (and gives up overlapping the
    # all-reduces with backward).
    one_bucket = args.contender == "ddp-powersgd"
    model = torch.nn.parallel.DistributedDataParallel(
        net, bucket_cap_mb=_whole_model_mb(net) if one_bucket else None)
    if args.contender == "ddp-fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.contender == "ddp-powersgd":
        model.register_comm_hook(  # (held by DDP alone: freed with it, below)
            psgd.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                               start_powerSGD_iter=2, min_compression_rate=2),
            psgd.powerSGD_hook)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr)
    cursor = DataCursor(len(data), args.global_batch, seed=args.seed)
    clock, curve, step_times = Clock(), [], []
    steps = args.measure_steps or args.batches
    for step in range(steps):
        began = time.perf_counter()
        x, y = data.batch(cursor.rank_indices(rank, [1.0] * world))
        _set_lr(opt, lr_at(args, step))
        opt.zero_grad()
        _loss(model, x, y).backward()
        opt.step()
        cursor.commit()
        step_times.append(time.perf_counter() - began)
        if not args.measure_steps and ((step + 1) % args.eval_every == 0 or step + 1 == steps):
            paused = clock.pause()
            curve.append([(step + 1) * args.global_batch, clock.now(), _evaluate(net, held_out)])
            clock.resume(paused)
    wall = clock.now()
    # DDP's reducer must let go of the group first (as in straggler_job): freed after
    # destroy_process_group, as the last holder of the Gloo group, its destructor joins
    # Gloo's threads while one of them may wait for the GIL (torch 2.13). With the
    # PowerSGD hook, whose callbacks run Python on those threads, the process aborted
    # at exit ("terminate called without an active exception") in one of two runs.
    del model
    gc.collect()
    dist.destroy_process_group()
    return {"curve": curve, "wall_s": wall, "step_times": step_times, "steps": steps}


def lr_at(args: JobArgs, step: int) -> float:
    """The rate of optimizer step ``step`` (from 0): ``args.lr``, ramped up linearly over
    ``args.warmup`` steps, and with ``args.decay`` times a cosine from 1 down to 0.1 at
    ``args.batches`` steps (0.1 from there on)."""
    rate = args.lr * min(1.0, (step + 1) / args.warmup) if args.warmup else args.lr
    if args.decay:
        done = min(1.0, step / args.batches)
        rate *= 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * done))
    return rate


def _set_lr(opt: Any, rate: float) -> None:
    for group in opt.param_groups:
        group["lr"] = rate


def _whole_model_mb(net: Any) -> int:
    """A bucket cap (MiB) that holds every gradient of ``net`` in one bucket."""
    size = sum(p.numel() * p.element_size() for p in net.parameters())
    return int(size) // 2**20 + 1


def _diloco(args: JobArgs, net: Any, data: Any, held_out: Any) -> dict[str, Any]:
    import torch

    import potluck
    from potluck.compress import Int4Blockwise, Int8Blockwise
    from potluck.sync import DiLoCoSync

    codec = (Int8Blockwise() if args.contender.endswith("-int8")
             else Int4Blockwise() if args.contender.endswith("-int4") else None)
    extra: dict[str, Any] = {} if args.sync_measure is None else {"measure": args.sync_measure}
    if args.contender == "localsgd-int4":
        sync = potluck.LocalSGD(max(1, args.inner_steps // 2), codec=codec, **extra)
    elif args.contender.startswith("localsgd"):
        sync = potluck.LocalSGD(args.inner_steps, codec=codec, **extra)
    elif args.contender.startswith("streaming"):
        sync = potluck.StreamingDiLoCo(args.inner_steps, STREAMING_FRAGMENTS, codec=codec,
                                       **(args.outer or {}), **extra)
    else:
        sync = potluck.DiLoCo(inner_steps=args.inner_steps, codec=codec,
                              adaptive=args.contender != "diloco-fixed", **(args.outer or {}),
                              **extra)
    inner = torch.optim.AdamW(net.parameters(), lr=args.lr)
    model, opt, loader = potluck.prepare(net, inner, data, global_batch=args.global_batch,
                                         seed=args.seed, sync=sync, collate=data.collate)
    strategy = opt.part(DiLoCoSync)
    assert strategy is not None
    clock, curve, rounds = Clock(), [], []
    due, trained = args.batches * args.global_batch, 0  # samples (a lost part is owed)
    local = 0  # this rank's local steps: the schedule's clock
    while trained < due:
        for x, y in loader:
            _set_lr(inner, lr_at(args, local))
            local += 1
            opt.zero_grad()
            _loss(model, x, y).backward()
            before = opt.steps
            opt.step()
            if opt.steps == before:
                continue
            record = strategy.last
            assert record is not None
            trained += record.round_samples
            rounds.append({"inner_steps": record.inner_steps, "samples": record.samples,
                           "compute_s": record.compute_s, "wait_s": record.wait_s,
                           "sync_s": record.sync_s, "sent": record.sent_bytes,
                           "at_s": clock.now()})
            paused = clock.pause()
            curve.append([trained, clock.now(), _evaluate(net, held_out)])
            clock.resume(paused)
            if trained >= due:
                break
    wall = clock.now()
    opt.finish()
    return {"curve": curve, "wall_s": wall, "rounds": rounds, "sent": strategy.traffic.sent,
            "compute_s": sum(r["compute_s"] for r in rounds)}


if __name__ == "__main__":
    sys.exit(main())
