"""A small elastic training job whose outcome can be checked exactly (chaos bench, tests).

Every worker joins an elastic cohort on the store its caller hosts (as the launcher's
agent hosts it, ``potluck.cohort.join_elastic``), trains a float64 MLP set up by
``potluck.prepare``, and appends each committed step's sample indices to its own ledger
file (``potluck.testing.SampleLedger``). Three checks follow from the step transaction:

- ``single_process(job)``: one process training on the same global batches. Every step
  trains on the same global batch whatever the membership, so an elastic run ends with
  these parameters, up to summation order (float64: ``rtol=1e-9``).
- ``assert_exactly_once(dir, job.samples, job.epochs)`` (``potluck.testing``) on the
  ledgers: every sample of every epoch committed exactly once.
- ``leftover_processes(dir)``: no worker process outlived its run (pid files).

``fault_hook`` is called before every step with the committed step count: fault
injection (``potluck.testing.Faults``' injector, a leave, a cut link) happens there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from potluck.cohort import Cohort
from potluck.data import DataCursor
from potluck.data.step_loader import StepLoader
from potluck.reducer import DataParallel
from potluck.step import MinimumSize, StepTransaction
from potluck.sync import DiLoCoSync
from potluck.testing import SampleLedger
from potluck_lab.models import tiny_mlp


@dataclass(frozen=True)
class ElasticJob:
    """What every worker of the job agrees on (the data, the batch, the timeouts)."""

    samples: int = 48
    global_batch: int = 12  # divisible by 1, 2, 3 and 4: equal shares for any membership
    epochs: int = 2
    data_seed: int = 5  # the epoch permutation
    token: str = "secret"
    expected: int = 3  # founders of generation 0
    collective_timeout: float = 20.0  # a silent (frozen, cut-off) peer is given up on after
    heartbeat_interval: float = 0.2
    heartbeat_timeout: float = 1.5
    settle_timeout: float = 10.0
    join_timeout: float = 60.0
    store_timeout: float = 30.0
    step_pause: float = 0.0  # a stand-in for compute, so events land mid-run
    balance: bool = False  # shares by measured speed (potluck.prepare(balance=...))
    inner_steps: int = 0  # > 0: DiLoCo rounds of this many global batches (0: every step)
    # > 0: DiLoCo's local steps follow speeds, an unmeasured round starting with this
    # fraction even (0: a fixed H everywhere, the same split on any machine)
    measure: float = 0.0


class Indexed(Dataset[tuple[int, torch.Tensor, torch.Tensor]]):
    """``(index, x, y)``: the index lets the ledger record what was trained."""

    def __init__(self, samples: int) -> None:
        gen = torch.Generator().manual_seed(1000)
        self.x = torch.randn(samples, 8, generator=gen, dtype=torch.float64)
        self.y = torch.randn(samples, 4, generator=gen, dtype=torch.float64)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i]


def params(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


@dataclass
class Worker:
    """One worker's pieces, as a training script would hold them."""

    cohort: Cohort
    model: DataParallel
    cursor: DataCursor
    optimizer: StepTransaction
    loader: StepLoader


def start_worker(job: ElasticJob, worker_id: str, store_addr: str, port: int, *,
                 host: str = "127.0.0.1", token: str | None = None,
                 before_join: Callable[[], None] | None = None,
                 minimum: MinimumSize | None = None) -> Worker:
    """Join (or found) the cohort on the caller's store; ``host``: where Gloo binds.

    ``before_join`` runs once the slow local setup is done, just before joining (a
    late worker waits there for its moment).
    """
    from torch._C._distributed_c10d import TCPStore

    from potluck import DiLoCo, prepare
    from potluck.cohort import GroupSpec, join_elastic
    from potluck.rendezvous import RendezvousConfig

    # Everything slow and local comes before joining. Once admitted, a late joiner is in
    # the cohort's group and the members wait for it in the state broadcast, bounded by
    # the collective timeout; a process's first torch optimizer takes seconds to build
    # (it imports torch._dynamo), enough to time that broadcast out on a busy machine.
    net = tiny_mlp()
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    if before_join is not None:
        before_join()
    store = TCPStore(store_addr, port, is_master=False,
                     timeout=timedelta(seconds=job.store_timeout))
    config = RendezvousConfig(token=job.token if token is None else token,
                              expected=job.expected,
                              heartbeat_interval=job.heartbeat_interval,
                              heartbeat_timeout=job.heartbeat_timeout,
                              settle_timeout=job.settle_timeout,
                              join_timeout=job.join_timeout)
    cohort = join_elastic(store, worker_id, config,
                          GroupSpec("gloo", job.collective_timeout, host))
    sync = DiLoCo(job.inner_steps, adaptive=job.measure > 0, measure=job.measure,
                  min_gain=0.0) if job.inner_steps else None
    model, opt, loader = prepare(net, sgd, Indexed(job.samples), cohort=cohort,
                                 global_batch=job.global_batch, seed=job.data_seed,
                                 minimum=minimum, balance=job.balance or None, sync=sync)
    return Worker(cohort, model, opt.cursor, opt, loader)


def train(worker: Worker, job: ElasticJob, ledger: Path,
          fault_hook: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Train ``job.epochs`` epochs (or until this worker leaves); append to ``ledger``.

    The ledger gets the samples of each committed step (under DiLoCo: of this worker's
    part of each committed round) and is flushed at once, so it outlives a SIGKILL.
    Returns the final parameters, the cohort's events and what this worker saw.
    """
    cohort, model, cursor, opt = worker.cohort, worker.model, worker.cursor, worker.optimizer
    detected_s: float | None = None  # the first failed step: how long it took to fail
    detected_at: float | None = None  # ... and when it failed (wall clock)
    pending: list[int] = []  # this worker's samples of the step (round) under way
    lost: list[list[int]] = []  # positions the committed rounds lost with members
    with SampleLedger(ledger) as out:
        while cursor.epoch < job.epochs and not opt.left:
            for index, x, y in worker.loader:
                if fault_hook is not None:
                    fault_hook(opt.steps)
                if job.step_pause:
                    time.sleep(job.step_pause)
                epoch, commits, started = cursor.epoch, opt.progress.steps, time.monotonic()
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                if model.step_failed and detected_s is None:
                    detected_s, detected_at = time.monotonic() - started, time.time()
                result = opt.step()
                pending += index.tolist() if result.committed else []
                if opt.progress.steps > commits:  # the step (round) committed, with these
                    # samples (a round that lost a member's part too: opt.steps waits)
                    out.record(epoch, pending)
                    pending = []
                    record = getattr(opt.part(DiLoCoSync), "last", None)
                    lost += [list(r) for r in record.lost] if record else []
                elif result.failed:
                    pending = []  # the step is redone
    cohort.close()
    return {"params": params(model.module), "events": cohort.events, "redone": opt.redone,
            "detected_s": detected_s, "detected_at": detected_at, "left": opt.left,
            "steps": opt.steps, "world_size": cohort.world_size, "generation": cohort.generation,
            "joined_late": cohort.joined_late, "lost": lost}


def wait_for_joiner(cohort: Cohort, limit: float = 90.0) -> None:
    """Until a worker waits to be admitted (at the cohort's next boundary)."""
    deadline = time.monotonic() + limit
    while not cohort.pending_joiners():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no worker asked to join within {limit:g} s")
        time.sleep(0.02)


def single_process(job: ElasticJob) -> dict[str, torch.Tensor]:
    """The reference: one process, the same global batches, plain SGD."""
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cursor, data = DataCursor(job.samples, job.global_batch, seed=job.data_seed), \
        Indexed(job.samples)
    for _ in range(job.epochs * (job.samples // job.global_batch)):
        idx = cursor.global_indices()
        opt.zero_grad()
        ((model(data.x[idx]) - data.y[idx]) ** 2).mean().backward()
        opt.step()
        cursor.commit()
    return params(model)


def max_param_diff(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two sets of parameters."""
    return max(float((got[name] - value).abs().max()) for name, value in expected.items())


def write_pid(directory: Path, name: str) -> None:
    """Record this process (pid and start time), for ``leftover_processes``."""
    Path(directory, f"{name}.pid").write_text(f"{os.getpid()} {_start_time(os.getpid())}")


def leftover_processes(directory: Path) -> list[int]:
    """Recorded processes that are still running (a zombie counts as gone)."""
    alive = []
    for path in sorted(Path(directory).glob("*.pid")):
        pid, started = path.read_text().split()
        if _start_time(int(pid)) == started and _state(int(pid)) not in ("Z", "X", None):
            alive.append(int(pid))
    return alive


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()  # fields after the command name


def _start_time(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[19] if fields else None  # field 22 of proc(5)


def _state(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[0] if fields else None
