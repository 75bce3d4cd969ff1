"""A worker of ``potluck bench straggler``: one long-lived process per rank, told what to run.

    python -m potluck_lab.bench.straggler_job --dir DIR --rank 1 --world-size 2 --cpu 1 \\
        --cgroup /sys/fs/cgroup/cpu/potluck-straggler-123

Before it imports torch the worker moves itself into its cgroup (the slow rank: every
thread it will start, Gloo's too, is then under the quota) and pins itself to its CPU,
so the rank's whole process is set up before any work. It then waits for commands, one
file per run (``DIR/run-<k>.json``, written by the bench), and runs each in turn:

- ``ddp``: ``torch.nn.parallel.DistributedDataParallel``, equal shares of each step;
- ``potluck`` / ``balanced``: ``potluck.prepare(balance=False / True)``;
- ``solo``: this rank alone (``prepare`` on a one-process cohort), until ``DIR/run-<k>/stop``.

Every contender trains the same model on the same global batches, built from samples
one by one (``default_collate``, as potluck's loader does), so they differ only in how
the step is shared and reduced. Each rank appends a ``step`` record per step to
``DIR/run-<k>/steps-<rank>.jsonl`` (``potluck.metrics.journal``: split, timings, CPU
time, the balancer's speeds) and a ``done`` at the end; with ``check``, rank 0 also
trains one process on the same global batches and reports ``max_param_diff``. The
worker exits on ``DIR/stop``, or when the bench is gone; a failure is written to
``DIR/error-<rank>.txt``. On the bench's side, ``QuotaSchedule`` changes the slow rank's
quota when the step records reach given steps.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from potluck_lab.machine.cpu_quota import join  # no torch: the worker moves in before it

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from potluck.balance import BalanceConfig
    from potluck.metrics.journal import Journal
    from potluck_lab.machine.cpu_quota import CpuQuota

CONTENDERS = ("ddp", "potluck", "balanced", "solo")
SAMPLES, TOKENS, FEATURES, WIDTH, DEPTH = 8192, 16, 32, 256, 3
SEED, LR = 3, 0.01
_POLL_S = 0.005


@dataclass(frozen=True)
class Command:
    """One run: what every worker trains (the bench writes it, each worker reads it)."""

    index: int
    contender: str
    port: int
    steps: int  # global steps; for ``solo`` an upper bound (the bench stops it)
    global_batch: int
    dtype: str = "float32"
    check: bool = False  # rank 0 compares with one process on the same global batches
    smoothing: float | None = None  # BalanceConfig's, for ``balanced``; None: its default
    min_gain: float | None = None


def command_path(directory: Path, index: int) -> Path:
    return directory / f"run-{index}.json"


def run_dir(directory: Path, index: int) -> Path:
    return directory / f"run-{index}"


def write_command(directory: Path, command: Command) -> Path:
    """Publish a command in one rename (a worker never reads half of it)."""
    run_dir(directory, command.index).mkdir(parents=True, exist_ok=True)
    target = command_path(directory, command.index)
    partial = target.with_suffix(".tmp")
    partial.write_text(json.dumps(asdict(command)))
    partial.rename(target)
    return target


class QuotaSchedule:
    """Sets ``quota`` once ``rank`` has recorded given steps, ``[(after_step, fraction)]``;
    fed each new batch of step records (dicts with ``kind``, ``rank``, ``step``), it
    keeps in ``applied`` when (wall clock) it made each change. The bench runs it."""

    def __init__(self, quota: CpuQuota, rank: int,
                 changes: list[tuple[int, float]]) -> None:
        self.quota, self.rank, self.pending = quota, rank, list(changes)
        self.applied: list[tuple[float, float]] = []

    def feed(self, new: list[dict[str, Any]]) -> None:
        for record in new:
            if int(record["rank"]) != self.rank or record["kind"] != "step":
                continue
            while self.pending and int(record["step"]) >= self.pending[0][0]:
                fraction = self.pending.pop(0)[1]
                self.quota.set(fraction)
                self.applied.append((time.time(), fraction))


def workload(dtype: torch.dtype) -> tuple[nn.Module, TensorDataset]:
    """The same model and data on every worker: an MLP applied to each of a sample's
    tokens, a regression target per token (many FLOPs per sample for few parameters,
    so compute dominates the all-reduce)."""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from potluck_lab.models import mlp

    gen = torch.Generator().manual_seed(SEED)
    data = TensorDataset(torch.randn(SAMPLES, TOKENS, FEATURES, generator=gen, dtype=dtype),
                         torch.randn(SAMPLES, TOKENS, generator=gen, dtype=dtype))
    net = mlp([FEATURES, *[WIDTH] * DEPTH, 1], seed=SEED, dtype=dtype)
    net.append(nn.Flatten(1))  # (batch, tokens)
    return net, data


class Worker:
    """This rank's side of the bench: wait for a command, run it, record, repeat."""

    def __init__(self, directory: Path, rank: int, world_size: int) -> None:
        self.directory, self.rank, self.world_size = directory, rank, world_size

    def serve(self) -> None:
        index = 0
        while self._wait_for(command_path(self.directory, index)):
            fields = json.loads(command_path(self.directory, index).read_text())
            self.run(Command(**fields))
            index += 1

    def _wait_for(self, path: Path) -> bool:
        stop = self.directory / "stop"
        while not path.exists():
            if stop.exists():
                return False
            time.sleep(_POLL_S)
        return True

    def run(self, command: Command) -> None:
        import torch

        from potluck.metrics.journal import Journal

        if command.contender not in CONTENDERS:
            raise ValueError(f"run {command.index}: contender {command.contender!r} is not "
                             f"one of {', '.join(CONTENDERS)} (the bench and its workers "
                             "must be the same version)")
        folder = run_dir(self.directory, command.index)
        dtype = getattr(torch, command.dtype)
        with Journal(folder / f"steps-{self.rank}.jsonl") as journal:
            if command.contender == "ddp":
                params = self._ddp(command, dtype, journal)
            else:
                params = self._potluck(command, dtype, journal, folder / "stop")
            done: dict[str, Any] = {"rank": self.rank}
            if command.check and self.rank == 0:
                done["max_param_diff"] = max_diff(params, reference(command, dtype))
            journal.write("done", steps=command.steps, **done)

    def _potluck(self, command: Command, dtype: torch.dtype, journal: Journal,
                 stop: Path) -> dict[str, torch.Tensor]:
        import torch

        import potluck
        from potluck.balance import Balancer
        from potluck.env import WorkerEnv

        solo = command.contender == "solo"
        env = WorkerEnv() if solo else WorkerEnv(
            rank=self.rank, world_size=self.world_size, master_addr="127.0.0.1",
            master_port=command.port, source="torchrun")
        cohort = potluck.init(env=env, timeout=120.0)
        net, data = workload(dtype)
        sgd = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
        batch = command.global_batch // self.world_size if solo else command.global_batch
        model, opt, loader = potluck.prepare(net, sgd, data, cohort=cohort, global_batch=batch,
                                             seed=SEED, balance=_balance(command))
        # The balancer's gathered speeds go into the records (to see how it reacts).
        balancer = opt.part(Balancer)
        timer = _StepTimer(next(net.parameters()))
        while opt.steps < command.steps and not (solo and stop.exists()):
            for x, y in loader:
                timer.step(model, opt, x, y)
                speeds = None if balancer is None else balancer.speeds
                journal.write("step", step=opt.steps - 1, rank=self.rank, split=loader.split,
                              speeds=list(speeds) if speeds else None, **timer.done())
                if opt.steps >= command.steps or (solo and stop.exists()):
                    break
        cohort.close()
        return {n: p.detach().clone() for n, p in model.module.named_parameters()}

    def _ddp(self, command: Command, dtype: torch.dtype,
             journal: Journal) -> dict[str, torch.Tensor]:
        from datetime import timedelta

        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import default_collate

        from potluck.data import DataCursor

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{command.port}",
                                rank=self.rank, world_size=self.world_size,
                                timeout=timedelta(seconds=120))
        net, data = workload(dtype)
        sgd = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
        model = DistributedDataParallel(net)
        cursor = DataCursor(len(data), command.global_batch, seed=SEED)
        split = [len(cursor.rank_indices(r, world_size=self.world_size))
                 for r in range(self.world_size)]
        timer = _StepTimer(next(net.parameters()))
        for step in range(command.steps):
            indices = cursor.rank_indices(self.rank, world_size=self.world_size)
            x, y = default_collate([data[i] for i in indices])
            timer.step(model, sgd, x, y)
            cursor.commit()
            journal.write("step", step=step, rank=self.rank, split=split, speeds=None,
                          **timer.done())
        # DDP's reducer must let go of the group first: were it the last holder, the
        # group's destructor would join Gloo's threads holding the GIL, while one of them
        # waits for the GIL to free a finished work item (a deadlock, torch 2.13).
        del model
        gc.collect()
        dist.destroy_process_group()
        return {n: p.detach().clone() for n, p in net.named_parameters()}


def _balance(command: Command) -> bool | BalanceConfig:
    """``prepare(balance=...)`` for the command: its BalanceConfig fields, or defaults."""
    if command.contender != "balanced":
        return False
    return balance_config(command.smoothing, command.min_gain)


def balance_config(smoothing: float | None, min_gain: float | None) -> BalanceConfig:
    """The balanced runs' ``BalanceConfig``: the fields given, potluck's defaults else."""
    from potluck.balance import BalanceConfig

    default = BalanceConfig()
    return BalanceConfig(smoothing=default.smoothing if smoothing is None else smoothing,
                         min_gain=default.min_gain if min_gain is None else min_gain)


class _StepTimer:
    """Wall seconds of a step's parts: ``load``, ``fwd``, ``bwd`` (this rank's own work,
    until the first layer's gradient, the last one), ``wait`` (the rest of backward: the
    all-reduce, that is waiting for the slowest peer), ``opt`` (the optimizer step, with
    potluck's end-of-step collectives); and the step's CPU seconds (every thread)."""

    def __init__(self, first: torch.Tensor) -> None:
        self._start, self._cpu = time.perf_counter(), time.process_time()
        self._marks: dict[str, float] = {}
        first.register_hook(lambda grad: self.mark("grads"))  # type: ignore[no-untyped-call]

    def mark(self, name: str) -> None:
        self._marks[name] = time.perf_counter()

    def step(self, model: nn.Module, optimizer: Any, x: torch.Tensor, y: torch.Tensor) -> None:
        """One training step on the batch just loaded, its parts marked."""
        import torch

        self.mark("loaded")
        optimizer.zero_grad()
        out = model(x)
        self.mark("forward")
        torch.nn.functional.mse_loss(out, y).backward()  # type: ignore[no-untyped-call]
        self.mark("backward")
        optimizer.step()

    def done(self) -> dict[str, float]:
        now, cpu, marks = time.perf_counter(), time.process_time(), self._marks
        loaded, forward, backward = marks["loaded"], marks["forward"], marks["backward"]
        grads = min(marks.get("grads", backward), backward)
        times = {"load_s": loaded - self._start, "fwd_s": forward - loaded,
                 "bwd_s": grads - forward, "wait_s": backward - grads,
                 "opt_s": now - backward, "cpu_s": cpu - self._cpu}
        self._start, self._cpu, self._marks = now, cpu, {}
        return times


def reference(command: Command, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One process trained on the same global batches (the cursor's order)."""
    import torch

    from potluck.data import DataCursor

    net, data = workload(dtype)
    sgd = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    cursor = DataCursor(len(data), command.global_batch, seed=SEED)
    for _ in range(command.steps):
        x, y = data[cursor.global_indices()]
        sgd.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()  # type: ignore[no-untyped-call]
        sgd.step()
        cursor.commit()
    return {n: p.detach().clone() for n, p in net.named_parameters()}


def max_diff(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    return max(float((got[name] - value).abs().max()) for name, value in expected.items())


def _exit_with_parent() -> None:
    """The bench is gone (even SIGKILLed): leave at once, no worker outlives it."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="straggler-parent-watch", daemon=True).start()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path, help="where commands and logs are")
    parser.add_argument("--rank", required=True, type=int)
    parser.add_argument("--world-size", required=True, type=int)
    parser.add_argument("--cpu", required=True, type=int, help="the CPU this rank runs on")
    parser.add_argument("--cgroup", type=Path, help="the cgroup this rank moves into")
    return parser


def main() -> int:
    args = _parser().parse_args()
    # Before anything else (torch starts threads): every thread inherits both.
    if args.cgroup is not None:
        join(args.cgroup)
    os.sched_setaffinity(0, {args.cpu})
    _exit_with_parent()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a stuck run: kill -USR1 pid
    try:
        import torch

        torch.set_num_threads(1)
        warm = torch.zeros(1, requires_grad=True)
        torch.optim.SGD([warm], lr=0.1)  # the first optimizer imports torch._dynamo (~2 s)
        from potluck.metrics.journal import Journal  # (potluck.metrics imports torch)

        with Journal(args.dir / "workers.jsonl") as workers:
            workers.write("hello", launch_rank=args.rank, restart=0, cpu=args.cpu)
        Worker(args.dir, args.rank, args.world_size).serve()
    except BaseException:
        (args.dir / f"error-{args.rank}.txt").write_text(traceback.format_exc())
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    # Every run closed its cohort and its journal: skip the interpreter's teardown of
    # torch (1.5 s or more, which the bench would wait for).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
