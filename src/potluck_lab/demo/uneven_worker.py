"""The uneven demo's worker: ``potluck demo --uneven`` starts it as

    potluck run --balance --nproc-per-node 2 -m potluck_lab.demo.uneven_worker ...

Before it trains, a worker pins itself to a core of its own (``--cores``) and the slowed
one (``--slow-rank``) takes its handicap: it moves its whole process into the CPU-quota
cgroup the demo made (``--cgroup``; after its imports, before it joins the cohort), or,
where none could be made (``--sleep-fraction``), sleeps in every forward for as long as
running at that fraction of a core would add, from its own speed timed here first.
Then it trains the README's way: ``potluck.init()``, ``potluck.prepare`` (which
balances under ``potluck run --balance``: each worker's share of a step by its measured
speed), and the plain loop; then ``--equal-steps`` more on equal shares
(``prepare(balance=False)``, the same weights and slowdown) to measure what balancing
gained. Rank 0 appends a ``step`` record of ``potluck.metrics.journal`` per step to
``--metrics``: the demo's fields plus ``phase`` (``balanced`` or ``equal``), ``shares``
(samples per rank of that step: ``loader.split``) and ``speeds`` (samples/s per rank as
the balancer measured them after it; null while not measured, empty without one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

import potluck
from potluck.balance import Balancer
from potluck.cohort import Cohort
from potluck.env import read_worker_env
from potluck.metrics.journal import Journal
from potluck.step import StepTransaction
from potluck_lab.demo.elastic_worker import Windows
from potluck_lab.demo.presets import worker_parser
from potluck_lab.demo.train import learning_rate
from potluck_lab.machine import cpu_quota
from potluck_lab.models import CharTransformer, ModelConfig, language_model_loss
from potluck_lab.text import Vocabulary, load_corpus

PEAK_LR, WARMUP_STEPS = 3e-3, 20


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = worker_parser("potluck_lab.demo.uneven_worker")
    parser.add_argument("--metrics", type=Path, required=True, help="rank 0's step records")
    parser.add_argument("--cores", default="",
                        help="comma-separated cores, one per local rank ('': no pinning)")
    parser.add_argument("--slow-rank", type=int, default=None, help="the launch rank slowed")
    parser.add_argument("--cgroup", type=Path, default=None,
                        help="the slowed worker moves its whole process into this cgroup")
    parser.add_argument("--equal-steps", type=int, default=0,
                        help="then train this many steps on equal shares (balance=False), "
                             "to measure what balancing gained")
    parser.add_argument("--sleep-fraction", type=float, default=None,
                        help="no cgroup: the slowed worker sleeps in each forward as if it "
                             "ran at this fraction of a core")
    return parser.parse_args(argv)


def pin(cores: str, local_rank: int) -> None:
    """Run on ``cores``' entry for this local rank alone (no entry: leave it be)."""
    chosen = [int(core) for core in cores.split(",") if core]
    if local_rank < len(chosen):
        os.sched_setaffinity(0, {chosen[local_rank]})


def sleep_per_sample(net: nn.Module, x: torch.Tensor, y: torch.Tensor,
                     fraction: float) -> float:
    """Seconds to sleep per sample so that this worker runs as if on ``fraction`` of a
    core: its full-speed seconds per sample (the median of timed passes) times
    ``1 / fraction - 1``."""
    times = []
    for _ in range(5):
        started = time.perf_counter()
        language_model_loss(net(x), y).backward()  # type: ignore[no-untyped-call]
        times.append(time.perf_counter() - started)
    net.zero_grad(set_to_none=True)
    return statistics.median(times[2:]) / len(x) * (1.0 / fraction - 1.0)


def slow_down_by_sleeping(net: nn.Module, seconds_per_sample: float) -> None:
    """Sleep in every forward of ``net``, for its batch's samples: inside the time the
    balancer measures (the step's first forward to its last gradient)."""
    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        time.sleep(seconds_per_sample * len(inputs[0]))

    net.register_forward_pre_hook(hook)


def global_mean_loss(cohort: Cohort, loss: torch.Tensor, samples: int,
                     global_batch: int) -> float:
    """The global batch's mean loss: every rank's mean weighed by its part of the step."""
    part = loss.detach().reshape(1) * (samples / global_batch)
    if cohort.world_size > 1:
        cohort.group.allreduce([part]).wait()
    return float(part)


def train(cohort: Cohort, net: nn.Module, adamw: torch.optim.Optimizer, data: Windows,
          args: argparse.Namespace, journal: Journal | None, *, phase: str, steps: int,
          first: int = 0, balance: bool | None = None) -> StepTransaction:
    """The README's loop on ``potluck.prepare`` for ``steps`` steps (``balance``: None,
    as ``potluck run`` says); rank 0 records every step, numbered from ``first``."""
    model, opt, loader = potluck.prepare(net, adamw, data, cohort=cohort,
                                         global_batch=args.batch_size, seed=args.seed,
                                         drop_last=True, clip_grad_norm=1.0, balance=balance)
    balancer = _balancer(opt)
    for x, y in loader:  # one epoch is --steps steps
        started = time.perf_counter()
        lr = learning_rate(min(first + opt.steps, args.steps - 1), args.steps, PEAK_LR,
                           WARMUP_STEPS)
        for group in adamw.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        loss = language_model_loss(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        mean = global_mean_loss(cohort, loss, len(x), args.batch_size)
        if journal is not None:
            step_s = time.perf_counter() - started
            rate = args.batch_size / step_s
            speeds = list(balancer.speeds) if balancer is not None else []
            journal.write("step", step=first + opt.steps - 1, loss=mean, step_s=step_s,
                          samples_per_s=rate, tokens_per_s=rate * args.context, lr=lr,
                          workers=cohort.world_size, generation=cohort.generation,
                          shares=list(loader.split), speeds=speeds, phase=phase)
        if opt.steps >= steps:
            break
    return opt


def _balancer(opt: StepTransaction) -> Balancer | None:
    """The share policy ``prepare`` chose, if it balances (``potluck run --balance``)."""
    return opt.part(Balancer)


def handicap(args: argparse.Namespace, net: nn.Module, data: Windows,
             world_size: int) -> float:
    """The slowed worker's slowdown, taken before it trains: into the quota's cgroup,
    or a sleep in every forward; returns the sleep per sample (0.0: none)."""
    if args.cgroup is not None:
        # Every thread, after the imports (those at 0.4 of a core would only make the
        # start slower, and the start is not what is balanced).
        cpu_quota.join(args.cgroup)
    if args.sleep_fraction is None:
        return 0.0
    share = max(1, args.batch_size // world_size)
    x, y = (torch.stack(column) for column in zip(*(data[i] for i in range(share)),
                                                  strict=True))
    pause = sleep_per_sample(net, x, y, args.sleep_fraction)
    slow_down_by_sleeping(net, pause)
    return pause


def train_equal(cohort: Cohort, net: nn.Module, config: ModelConfig, data: Windows,
                args: argparse.Namespace, journal: Journal | None, pause: float) -> None:
    """The same workers, slowdown and weights on equal shares: what balancing gained."""
    twin = CharTransformer(config)  # a fresh module: net carries the first wrapper's hooks
    twin.load_state_dict(net.state_dict())
    if pause > 0:
        slow_down_by_sleeping(twin, pause)
    adamw = torch.optim.AdamW(twin.parameters(), lr=PEAK_LR, weight_decay=0.01)
    train(cohort, twin, adamw, data, args, journal, phase="equal", steps=args.equal_steps,
          first=args.steps, balance=False)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    me = read_worker_env()
    pin(args.cores, me.local_rank)
    slowed = me.rank == args.slow_rank
    torch.set_num_threads(1)
    text = load_corpus(args.corpus_chars, args.seed)
    vocab = Vocabulary.from_text(text)
    data = Windows(vocab.encode(text), args.steps, args.batch_size, args.context, args.seed)
    torch.manual_seed(args.seed)
    config = ModelConfig(vocab.size, args.context, args.d_model, args.n_layers)
    net = CharTransformer(config)
    # The first optimizer a process makes imports much of torch (seconds): before the
    # slowdown, which is for training, not for starting up.
    adamw = torch.optim.AdamW(net.parameters(), lr=PEAK_LR, weight_decay=0.01)
    pause = handicap(args, net, data, me.world_size) if slowed else 0.0
    cohort = potluck.init()
    journal = Journal(args.metrics, truncate=True) if cohort.rank == 0 else None
    try:
        opt = train(cohort, net, adamw, data, args, journal, phase="balanced",
                    steps=args.steps)
        if args.equal_steps > 0:
            train_equal(cohort, net, config, data, args, journal, pause)
        if slowed and args.cgroup is not None:
            cpu_quota.leave(args.cgroup)  # the quota is for training, not for shutting down
        opt.finish()
    finally:
        if journal is not None:
            journal.close()


if __name__ == "__main__":
    main()
