"""The demo's worker: one rank's training loop under ``potluck.DataParallel``.

``train_worker(cohort, text, config)`` runs in each worker that ``potluck run`` starts
(``demo/worker.py``), on the cohort ``potluck.init()`` joined. The loop is the ordinary
forward / backward / step / zero_grad; potluck comes in only as the wrapped model. Rank 0
writes the per-step JSONL (the demo process follows it for its progress bar); every rank
returns its timings, and rank 0 also a sample of generated text.

A metrics record is a ``step`` record of ``potluck.metrics.journal`` (``kind``, ``time``,
``pid``): ``step``, ``loss`` (global-batch mean), ``step_s`` (rank 0's wall time for the
whole step), ``samples_per_s`` and ``tokens_per_s`` (global batch / step_s), ``sync_s``
(first gradient bucket launched to last one reduced; overlaps backward), ``lr``,
``workers``, ``generation`` (always 0: the plain demo's membership never changes) and
``shares`` (samples per rank of the step: equal in the plain demo).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from potluck.checkpoint import CheckpointManager, DistributedRng
from potluck.cohort import Cohort
from potluck.metrics.journal import Journal
from potluck.metrics.latency import RoundTrips, measure_round_trips
from potluck.metrics.observer import StepObserver
from potluck.metrics.observing import observer_for
from potluck.metrics.sync_timer import SyncTimer
from potluck.reducer import DataParallel
from potluck_lab.models import CharTransformer, ModelConfig, generate, language_model_loss
from potluck_lab.text import Vocabulary, batch_offsets, make_batch, rank_share


@dataclass(frozen=True)
class TrainConfig:
    """One training phase (the N-worker run, or the short 1-worker baseline)."""

    model: ModelConfig
    steps: int  # length of the learning-rate schedule
    global_batch: int
    stop_after: int | None = None  # run only this many steps of the schedule (baseline)
    seed: int = 0
    lr: float = 3e-3
    warmup_steps: int = 20
    label: str = "train"
    metrics_path: str | None = None
    progress: bool = True
    sample_chars: int = 0
    sample_prompt: str = "def "
    latency_repeats: int = 20
    checkpoint_dir: str | None = None  # where to checkpoint; None: never
    checkpoint_every: int = 0  # steps between checkpoints (0: only at the end)
    resume: bool = False  # continue from the newest good checkpoint in checkpoint_dir


@dataclass
class WorkerResult:
    """What one rank measured; ``sample`` is set on rank 0 only."""

    rank: int
    world_size: int
    losses: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    sync_s: list[float] = field(default_factory=list)
    round_trips: RoundTrips | None = None
    n_params: int = 0
    sample: str | None = None
    first_step: int = 0  # > 0 when the run resumed from a checkpoint


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up to ``peak``, then cosine decay to a tenth of it at the last step."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def train_worker(cohort: Cohort, text: str, config: TrainConfig) -> WorkerResult:
    """Train ``config.steps`` global steps on this rank's share of each global batch."""
    rank, world_size = cohort.rank, cohort.world_size
    torch.manual_seed(config.seed)
    vocab = Vocabulary.from_text(text)
    tokens = vocab.encode(text)
    model = CharTransformer(config.model)
    # Each step timed for the status page and the rank_step journal (potluck run
    # --status-port / --metrics-dir set them for the main phase).
    observer = observer_for(cohort, lambda: ddp.reducer.last_pass,
                            samples=lambda: (config.global_batch // world_size,
                                             config.global_batch))
    ddp = DataParallel(model, group=cohort.group, clock=observer)
    timer = SyncTimer()
    ddp.register_comm_hook(None, timer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
    result = WorkerResult(rank, world_size, n_params=sum(p.numel() for p in model.parameters()))
    checkpoints, state = _checkpointing(config, cohort, model, optimizer)
    if checkpoints is not None and config.resume:
        result.first_step = checkpoints.restore_latest(state) or 0

    journal = (Journal(config.metrics_path, truncate=result.first_step == 0)
              if rank == 0 and config.metrics_path else None)
    run_steps = config.steps if config.stop_after is None else config.stop_after
    try:
        observer.hear_notes()  # the checkpoints on the status page (closed below)
        for step in range(result.first_step, run_steps):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, config.steps, config.lr, config.warmup_steps)
            record = _train_step(ddp, optimizer, timer, observer, tokens, step, config)
            result.losses.append(record["loss"])
            result.step_s.append(record["step_s"])
            result.sync_s.append(record["sync_s"])
            if journal is not None:
                journal.write("step", **record, lr=optimizer.param_groups[0]["lr"],
                              workers=world_size, generation=0,
                              shares=[config.global_batch // world_size] * world_size)
            done = step + 1
            if checkpoints is not None and (
                done == run_steps
                or (config.checkpoint_every > 0 and done % config.checkpoint_every == 0)
            ):
                checkpoints.save(done, state, blocking=False)  # training goes on meanwhile
        if checkpoints is not None:
            checkpoints.wait()
    finally:
        observer.close()
        if journal is not None:
            journal.close()

    result.round_trips = measure_round_trips(ddp.group, result.n_params, config.latency_repeats)
    if rank == 0 and config.sample_chars > 0:
        result.sample = _sample(model, vocab, config)
    return result


def _checkpointing(
    config: TrainConfig, cohort: Cohort, model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
) -> tuple[CheckpointManager | None, dict[str, Any]]:
    """The checkpoint manager and the state it saves (the data is a function of the step,
    so model, optimizer and every rank's RNG are the whole training state)."""
    if config.checkpoint_dir is None:
        return None, {}
    rng = DistributedRng(cohort.group, cohort.device)
    state = {"model": model, "optimizer": optimizer, "rng": rng}
    return CheckpointManager(config.checkpoint_dir, keep=3), state


def _train_step(
    ddp: DataParallel,
    optimizer: torch.optim.Optimizer,
    timer: SyncTimer,
    observer: StepObserver,
    tokens: torch.Tensor,
    step: int,
    config: TrainConfig,
) -> dict[str, Any]:
    """One global step; returns its metrics (loss is the global-batch mean)."""
    context = config.model.context
    start = time.perf_counter()
    offsets = batch_offsets(step, config.seed, tokens.numel(), context, config.global_batch)
    inputs, targets = make_batch(tokens, rank_share(offsets, ddp.rank, ddp.world_size),
                                 context)
    loss = language_model_loss(ddp(inputs), targets)
    # The global-batch loss travels while backward runs; issued before the gradient
    # buckets, so every rank issues the collectives in the same order.
    mean_loss = loss.detach() / ddp.world_size
    group = ddp.group
    pending = group.allreduce([mean_loss]) if group is not None and ddp.world_size > 1 else None
    torch.autograd.backward(loss)
    observer.step_started()
    torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if pending is not None:
        pending.wait()
    observer.report(loss=float(mean_loss))
    observer.committed(step)
    step_s = time.perf_counter() - start
    samples_per_s = config.global_batch / step_s
    return {
        "step": step,
        "loss": float(mean_loss),
        "step_s": step_s,
        "samples_per_s": samples_per_s,
        "tokens_per_s": samples_per_s * context,
        "sync_s": timer.take(),
    }


def _sample(model: CharTransformer, vocab: Vocabulary, config: TrainConfig) -> str:
    generator = torch.Generator().manual_seed(config.seed)
    prompt = vocab.encode(config.sample_prompt)
    out = generate(model, prompt, config.sample_chars, generator=generator)
    return vocab.decode(out)
