"""The chaos demo's worker: ``potluck demo --chaos`` starts it under ``potluck run --elastic``.

One process (one incarnation of one worker) joins or founds the cohort with
``potluck.init()`` and ``potluck.prepare``, trains the demo's character transformer on its share of
every global step, and appends what happened to ``<run dir>/worker-<rank>-<pid>.jsonl``,
because the launcher passes nothing back but exit codes. The records (``hello``,
``member``, ``joined``, ``step``, ``redo``, ``event``, ``held``, ``waited``, ``done``) and
their fields are those of ``potluck.metrics.journal``; rank 0 alone writes ``step`` and
``waited``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

import potluck
from potluck.cohort import Cohort
from potluck.env import read_worker_env
from potluck.metrics.journal import Journal
from potluck.step import StepTransaction
from potluck_lab.demo.presets import worker_parser
from potluck_lab.demo.train import learning_rate
from potluck_lab.models import CharTransformer, ModelConfig, generate, language_model_loss
from potluck_lab.text import Vocabulary, batch_offsets, load_corpus

PEAK_LR, WARMUP_STEPS, SAMPLE_PROMPT = 3e-3, 20, "def "
HOLD_S = 20.0  # the victim's longest wait for the driver's SIGKILL (it comes in ~0.1 s)


class Windows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The windows of the plain demo's steps 0..steps-1, as one dataset: item i is
    ``(inputs, next-character targets)`` of window i. The data cursor permutes them."""

    def __init__(self, tokens: torch.Tensor, steps: int, global_batch: int, context: int,
                 seed: int) -> None:
        self.tokens, self.context = tokens, context
        self.offsets = torch.cat([batch_offsets(step, seed, tokens.numel(), context,
                                                global_batch) for step in range(steps)])

    def __len__(self) -> int:
        return self.offsets.numel()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = int(self.offsets[index])
        window = self.tokens[start : start + self.context + 1]
        return window[:-1], window[1:]


class StepWatch:
    """After each ``opt.step()``: records the committed step, a failed one, new events."""

    def __init__(self, journal: Journal, cohort: Cohort, opt: StepTransaction) -> None:
        self.journal, self.cohort, self.opt = journal, cohort, opt
        self._steps, self._redone, self._events = opt.steps, opt.redone, len(cohort.events)
        self._generation, self._world_size = cohort.generation, cohort.world_size
        self.started = time.perf_counter()

    def start(self) -> None:
        self.started = time.perf_counter()

    def after_step(self, loss: float) -> None:
        step_s = time.perf_counter() - self.started
        for event in self.cohort.events[self._events:]:  # the new generation first
            self.journal.write("event", **event)
        if self.opt.redone > self._redone:  # abandoned: the loader hands it out again
            # Who redoes it: the new generation the optimizer recovered into.
            self.journal.write("redo", step=self.opt.steps, generation=self.cohort.generation,
                               workers=self.cohort.world_size)
        elif self.opt.steps > self._steps and self.cohort.rank == 0:
            # Membership as it was when the step trained (a boundary may follow it).
            self.journal.write("step", step=self.opt.steps - 1, loss=loss, step_s=step_s,
                               workers=self._world_size, generation=self._generation)
        self._steps, self._redone, self._events = (self.opt.steps, self.opt.redone,
                                                   len(self.cohort.events))
        self._generation, self._world_size = self.cohort.generation, self.cohort.world_size


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = worker_parser("potluck_lab.demo.elastic_worker")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--sample-chars", type=int, default=0)
    parser.add_argument("--heartbeat-timeout", type=float, default=2.0)
    parser.add_argument("--victim", type=int, default=None,
                        help="(chaos) this launch rank's first incarnation stops once "
                             "--kill-at steps have committed and waits for its SIGKILL")
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--rejoin-by", type=int, default=None,
                        help="(chaos) once this many steps have committed, a cohort short "
                             "of the launch's workers waits for a restarted one to ask to join")
    parser.add_argument("--rejoin-timeout", type=float, default=60.0)
    return parser.parse_args(argv)


def wait_for_the_kill(journal: Journal, steps: int) -> None:
    """The chaos victim, once ``steps`` steps have committed: say so, then wait for the
    driver's SIGKILL. The kill so lands at a step the driver knows: the others are in
    step ``steps + 1``, waiting for this worker's share of the gradients."""
    journal.write("held", step=steps)
    time.sleep(HOLD_S)
    raise RuntimeError(f"chaos: no SIGKILL came within {HOLD_S:g} s of stopping after step "
                       f"{steps}; the demo's driver is not following the run")


def wait_for_rejoin(journal: Journal, cohort: Cohort, steps: int, timeout: float) -> None:
    """Every survivor: wait until a restarted worker has asked to join (at most
    ``timeout`` s), so the boundary after the next step admits it before the run ends."""
    started = time.monotonic()
    while not (asked := cohort.pending_joiners()):
        if time.monotonic() - started > timeout:
            break
        time.sleep(0.05)
    if cohort.rank == 0:
        journal.write("waited", step=steps, waited_s=time.monotonic() - started, asked=asked,
                      workers=cohort.world_size)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    me = read_worker_env()
    journal = Journal(args.run_dir / f"worker-{me.rank}-{os.getpid()}.jsonl")
    journal.write("hello", launch_rank=me.rank, restart=me.restart_count)
    text = load_corpus(args.corpus_chars, args.seed)
    vocab = Vocabulary.from_text(text)
    data = Windows(vocab.encode(text), args.steps, args.batch_size, args.context, args.seed)
    torch.manual_seed(args.seed)  # the founders start equal; a joiner receives the state
    net = CharTransformer(ModelConfig(vocab.size, args.context, args.d_model, args.n_layers))
    # Built before joining: the first optimizer a process makes imports a lot of torch
    # (seconds), and between admission and receiving the state the cohort waits for us.
    adamw = torch.optim.AdamW(net.parameters(), lr=PEAK_LR, weight_decay=0.01)

    cohort = potluck.init(timeout=30.0, heartbeat_interval=0.4,
                          heartbeat_timeout=args.heartbeat_timeout)
    journal.write("member", worker_id=cohort.worker_id, rank=cohort.rank,
                  generation=cohort.generation, workers=cohort.world_size,
                  joined_late=cohort.joined_late)
    # A restarted worker receives the live state here.
    model, opt, loader = potluck.prepare(net, adamw, data, cohort=cohort,
                                         global_batch=args.batch_size, seed=args.seed,
                                         drop_last=True, clip_grad_norm=1.0)
    opt.leave_on_sigterm()  # the launcher stopping us (Ctrl-C): finish the step, leave
    if cohort.joined_late:
        journal.write("joined", step=opt.steps, rank=cohort.rank,
                      generation=cohort.generation, workers=cohort.world_size)
    watch = StepWatch(journal, cohort, opt)
    victim = args.victim == me.rank and me.restart_count == 0
    rejoin_wait = args.rejoin_by is not None

    while loader.epoch < 1 and not opt.left:  # one epoch is exactly --steps steps
        for x, y in loader:
            if victim and opt.steps == args.kill_at:
                wait_for_the_kill(journal, opt.steps)
            if rejoin_wait and opt.steps >= args.rejoin_by and cohort.world_size < me.world_size:
                rejoin_wait = False  # once: the chaos demo kills one worker
                wait_for_rejoin(journal, cohort, opt.steps, args.rejoin_timeout)
            watch.start()
            for group in adamw.param_groups:
                group["lr"] = learning_rate(opt.steps, args.steps, PEAK_LR, WARMUP_STEPS)
            opt.zero_grad()
            loss = language_model_loss(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]  # a lost peer marks the step failed
            opt.step()  # applied and committed only if every collective succeeded
            watch.after_step(float(loss.detach()))

    sample = None
    if cohort.rank == 0 and not opt.left and args.sample_chars > 0:
        out = generate(net, vocab.encode(SAMPLE_PROMPT), args.sample_chars,
                       generator=torch.Generator().manual_seed(args.seed))
        sample = vocab.decode(out)
    journal.write("done", steps=opt.steps, redone=opt.redone, left=opt.left,
                  rank=cohort.rank, generation=cohort.generation, workers=cohort.world_size,
                  n_params=sum(p.numel() for p in net.parameters()), sample=sample)
    journal.close()
    opt.finish()  # a restarted worker still waiting to be admitted is told it is over


if __name__ == "__main__":
    main()
