"""The torchrun contender's worker in ``potluck bench cohort``: plain torch DDP, written
as a user would write it today.

    python -m torch.distributed.run --nnodes 3:4 --nproc-per-node 1 --max-restarts 20 \\
        --rdzv-backend c10d --rdzv-endpoint HOST0:PORT \\
        -m potluck_lab.cohort_ddp_job --run-dir DIR --node-dir DIR/host1 --host 1 ...

The model, the samples, the held-out windows and the global batch are ``cohort_job``'s
(both build them with ``cohort_data``).
Each global step's batch is cut into ``world_size`` parts, one per rank (a
``DistributedSampler`` over a seeded permutation of each epoch). Every rank saves a
checkpoint every ``--checkpoint-every`` steps into its node's own directory. At start,
the ranks resume from the newest checkpoint any of them holds (its holder broadcasts it).
The ranks are torchrun's: it restarts every worker when one fails or a node joins.

``--attack-steps A:B``: this worker sends its gradient times -10 in global steps A to
B - 1 (a DDP comm hook before the all-reduce). DDP has no defense against it.

A worker writes JSON lines to ``DIR/node<host>-<pid>.log``: ``start`` (the step it
resumed from), ``commit`` (each step), ``eval`` (rank 0's held-out loss every
``--eval-every`` steps), ``attack``, ``done``; and its final parameters to ``.pt``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.futures import Future
from torch.nn.parallel import DistributedDataParallel

from potluck_lab.cohort_data import SIGN_FLIP, JsonLog, add_task_args, build_task


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="potluck_lab.cohort_ddp_job")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--node-dir", type=Path, required=True, help="this node's checkpoints")
    parser.add_argument("--host", type=int, required=True, help="this machine's number")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--stop-file", type=Path, default=None,
                        help="once it holds a number S, the job ends after global step S")
    add_task_args(parser)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--attack-steps", default="0:0", help="A:B, steps A to B-1")
    parser.add_argument("--timeout", type=float, default=300.0, help="collective timeout")
    return parser.parse_args(argv)


def stop_step(stop_file: Path | None, planned: int) -> int:
    """``planned``, or the step the stop file names once it is written."""
    if stop_file is None:
        return planned
    try:
        return min(planned, int(stop_file.read_text()))
    except (OSError, ValueError):  # not written yet
        return planned


def newest_checkpoint(node_dir: Path) -> tuple[int, Path | None]:
    steps = sorted((int(p.stem.split("-")[1]), p) for p in node_dir.glob("step-*.pt"))
    return steps[-1] if steps else (0, None)


def save_checkpoint(node_dir: Path, step: int, state: dict[str, Any], keep: int = 2) -> None:
    """Write ``step-<step>.pt`` whole (a temporary file, then a rename); keep the newest."""
    temporary = node_dir / f".step-{step}-{os.getpid()}.tmp"
    torch.save({"step": step, **state}, temporary)
    temporary.replace(node_dir / f"step-{step}.pt")
    for old in sorted(node_dir.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))[:-keep]:
        old.unlink(missing_ok=True)


def resume(node_dir: Path, rank: int, world_size: int) -> dict[str, Any] | None:
    """The newest checkpoint of any rank, sent by the lowest rank that holds it."""
    step, path = newest_checkpoint(node_dir)
    steps: list[int] = [0] * world_size
    dist.all_gather_object(steps, step)
    best = max(steps)
    if best == 0:
        return None
    source = steps.index(best)
    box = [torch.load(path, weights_only=True) if rank == source and path else None]
    dist.broadcast_object_list(box, src=source)
    state: dict[str, Any] | None = box[0]
    return state


def main(argv: Sequence[str] | None = None) -> None:
    from potluck_lab.models import language_model_loss

    args = parse_args(argv)
    torch.set_num_threads(1)
    args.node_dir.mkdir(parents=True, exist_ok=True)
    stem = args.run_dir / f"node{args.host}-{os.getpid()}"
    log = JsonLog(stem.with_suffix(".log"))
    task = build_task(args)
    net, adamw, data, hx, hy = task.net, task.optimizer, task.data, task.held_x, task.held_y

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    state = resume(args.node_dir, rank, world_size)
    step = 0
    if state is not None:
        net.load_state_dict(state["model"])
        adamw.load_state_dict(state["optimizer"])
        step = int(state["step"])
    log("start", rank=rank, workers=world_size, resumed=step,
        restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    model = DistributedDataParallel(net)  # (broadcasts rank 0's parameters)
    first, last = (int(v) for v in args.attack_steps.split(":"))
    attacking = [False]

    def flip(state: Any, bucket: GradBucket) -> Future[torch.Tensor]:
        if attacking[0]:
            bucket.buffer().mul_(SIGN_FLIP)
        return default_hooks.allreduce_hook(state, bucket)

    if last > first:
        # DDP checks the annotation's object; this module's annotations are strings
        flip.__annotations__.update(bucket=GradBucket, **{"return": Future[torch.Tensor]})
        model.register_comm_hook(None, flip)
    per_epoch = args.samples // args.global_batch  # (the last partial batch dropped)
    while step < stop_step(args.stop_file, args.epochs * per_epoch):
        epoch, at = divmod(step, per_epoch)
        order = torch.randperm(args.samples,
                               generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        mine = order[at * args.global_batch:(at + 1) * args.global_batch].tensor_split(
            world_size)[rank].tolist()
        x = torch.stack([data[i][0] for i in mine])
        y = torch.stack([data[i][1] for i in mine])
        attacking[0] = first <= step < last
        if attacking[0]:
            log("attack", step=step)
        adamw.zero_grad()
        # DDP averages over ranks: weigh this rank's mean by its part of the global batch
        loss = language_model_loss(model(x), y) * (len(mine) * world_size / args.global_batch)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        adamw.step()
        step += 1
        log("commit", steps=step, workers=world_size)
        if rank == 0 and step % args.eval_every == 0:
            with torch.no_grad():
                held_loss = float(language_model_loss(net(hx), hy))
            log("eval", steps=step, loss=held_loss, workers=world_size)
        if step % args.checkpoint_every == 0:
            save_checkpoint(args.node_dir, step,
                            {"model": net.state_dict(), "optimizer": adamw.state_dict()})
    torch.save(net.state_dict(), stem.with_suffix(".pt"))
    log("done", finished=True, steps=step)
    log.close()
    # DDP's reducer holds the group: drop it first. Freed last, from Python (with the
    # GIL held), the reducer destroys the Gloo group there, whose destructor joins a
    # thread that waits for the GIL: the worker hung at exit (torch 2.13; gdb: main
    # thread in ~ProcessGroupGloo under ~Reducer, a runloop thread in take_gil).
    # destroy_process_group then drops the last reference without the GIL.
    del model
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
