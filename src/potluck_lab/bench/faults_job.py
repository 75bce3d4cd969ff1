"""The training job of ``potluck bench faults``, in two flavours over the same workload.

    potluck run --elastic --token T --nproc-per-node 3 -m potluck_lab.bench.faults_job \\
        --mode elastic --run-dir DIR --steps 200
    python -m torch.distributed.run --standalone --nproc-per-node 3 --max-restarts 9 \\
        -m potluck_lab.bench.faults_job --mode checkpoint --run-dir DIR --steps 200

``elastic``: potluck.prepare under --elastic; a dead worker's step is redone by the
survivors and the restarted worker rejoins with the live state. ``checkpoint``: what users do today,
plain ``torch.nn.parallel.DistributedDataParallel`` on Gloo, a checkpoint every
``--checkpoint-every`` steps and a resume from the newest one after torchrun restarted
every worker. Both train the same float32 MLP on the same global batches.

What the bench reads (``DIR``), as ``potluck.metrics.journal`` records:
``started.jsonl``, a ``hello`` from every worker process (its pid); ``workers.jsonl``, a
``member`` per worker once it trains (pid, launch rank); ``commits-<pid>.jsonl``, every
worker's own log: a ``step`` per global step it committed, a ``redo`` per step it
abandoned (elastic) and a final ``done`` (see ``faults_figures``). Every worker logs,
so a step is on record even if the worker that logged first was killed between its
commit and its write.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from potluck.data import DataCursor
from potluck.env import read_worker_env
from potluck.metrics.journal import Journal
from potluck_lab.models import mlp

INPUTS, WIDTH, DEPTH = 256, 1024, 4


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("elastic", "checkpoint"), required=True)
    parser.add_argument("--run-dir", required=True, help="where the logs go")
    parser.add_argument("--steps", type=int, default=200, help="global steps to commit")
    parser.add_argument("--global-batch", type=int, default=192)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-pause", type=float, default=0.0,
                        help="seconds of sleep per step, a stand-in for compute (tests: a "
                             "job that lasts long enough for a kill on any machine)")
    parser.add_argument("--heartbeat-timeout", type=float, default=1.5,
                        help="elastic: seconds until a silent worker counts as gone")
    parser.add_argument("--collective-timeout", type=float, default=5.0,
                        help="elastic: seconds a collective may take before it fails")
    return parser


def workload() -> tuple[nn.Module, TensorDataset]:
    """The same model (seed 0) and synthetic regression data on every worker."""
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(3072, INPUTS, generator=gen),
                         torch.randn(3072, 1, generator=gen))
    return mlp([INPUTS, *[WIDTH] * DEPTH, 1], seed=0), data


def train_elastic(args: argparse.Namespace, run_dir: Path) -> None:
    import potluck

    net, data = workload()
    # Built before joining: the first optimizer imports torch._dynamo (about 2 s), and
    # the cohort would wait that long at the boundary that admits a restarted worker.
    sgd = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    # The survivors wait for a dead worker's heartbeat to go stale (heartbeat_timeout);
    # a survivor whose pending collective was not with the dead worker is released only
    # by the collective timeout, hence a short one.
    cohort = potluck.init(timeout=args.collective_timeout,
                          heartbeat_interval=args.heartbeat_timeout / 5,
                          heartbeat_timeout=args.heartbeat_timeout)
    admitted = time.time()
    # (a restarted worker receives the live state here)
    model, opt, loader = potluck.prepare(net, sgd, data, cohort=cohort,
                                         global_batch=args.global_batch, seed=1)
    commits = Journal(run_dir / f"commits-{os.getpid()}.jsonl")
    with Journal(run_dir / "workers.jsonl") as workers:
        workers.write("member", launch_rank=read_worker_env().rank, rank=cohort.rank,
                      generation=cohort.generation, workers=cohort.world_size,
                      admitted=admitted)
    while opt.steps < args.steps:
        for x, y in loader:
            time.sleep(args.step_pause)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
            if opt.step().failed:  # the cohort is in its next generation now
                commits.write("redo", step=opt.steps, generation=cohort.generation,
                              workers=cohort.world_size)
            else:
                commits.write("step", step=opt.steps - 1, generation=cohort.generation,
                              workers=cohort.world_size)
            if opt.steps >= args.steps:
                break
    commits.write("done", steps=opt.steps)
    commits.close()
    opt.finish()  # a restarted worker still waiting to be admitted exits by itself


def train_checkpoint(args: argparse.Namespace, run_dir: Path) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from potluck.checkpoint import CheckpointManager

    net, data = workload()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    generation = read_worker_env().restart_count  # torchrun restarts every worker
    model = DistributedDataParallel(net)
    cursor = DataCursor(len(data), args.global_batch, seed=1)
    state = {"model": net, "optimizer": opt, "cursor": cursor}
    checkpoints = CheckpointManager(run_dir / "checkpoints", keep=2, rank=rank)
    step = checkpoints.restore_latest(state) or 0  # after a restart: the newest one
    commits = Journal(run_dir / f"commits-{os.getpid()}.jsonl")
    with Journal(run_dir / "workers.jsonl") as workers:
        workers.write("member", launch_rank=read_worker_env().rank, rank=rank,
                      generation=generation, workers=world_size, resumed=step)
    while step < args.steps:
        x, y = data[cursor.rank_indices(rank, world_size=world_size)]
        time.sleep(args.step_pause)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
        cursor.commit()
        commits.write("step", step=step, generation=generation, workers=world_size)
        step += 1
        if step % args.checkpoint_every == 0:
            checkpoints.save(step, state, blocking=False)  # written in the background
    checkpoints.wait()
    commits.write("done", steps=step)
    commits.close()
    dist.destroy_process_group()


def main() -> None:
    args = _parser().parse_args()
    torch.set_num_threads(1)
    run_dir = Path(args.run_dir)
    # Every process the bench may have to clean up, even one that never got to train.
    me = read_worker_env()
    with Journal(run_dir / "started.jsonl") as started:
        started.write("hello", launch_rank=me.rank, restart=me.restart_count)
    if args.mode == "elastic":
        train_elastic(args, run_dir)
    else:
        train_checkpoint(args, run_dir)


if __name__ == "__main__":
    main()
