"""One worker of ``potluck bench cohort``: the demo's character transformer, trained by
``potluck run --elastic`` on each host of the cohort.

``--mode rounds``: what a cohort of consumer GPUs calls for: DiLoCo rounds planned by
speed, int8 pseudo-gradients, trust at the round's edge. ``--mode step``: every-step
sync, no trust. The global batch, the data and the model are the same in both.

A worker writes into ``--run-dir``, under ``node<N>-<pid>``:

- ``.jsonl``: the samples of each committed step or round (``SampleLedger``);
- ``.log``: JSON lines: ``eval`` (rank 0 after a commit, every ``--eval-every``
  commits: the held-out loss, the samples the cohort committed, the wall clock),
  ``commit`` (the steps, the wall clock), ``event`` (the cohort's events: generations,
  trust's quarantines), ``done``;
- ``.pt``: the final parameters, if the worker finished in the cohort.

``--halt-file``: once it holds S, every worker ends after the cohort's S-th commit
(all at the same commit: it is read at each step's start, where every member has the
same count), mid-epoch: a contender halted at the bench's time limit.

``--attacker-node N --attack-rounds A:B``: the worker of node N sends its pseudo-
gradient times -10 (the byzantine bench's sign flip) in rounds A to B - 1 (rounds mode).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.futures import Future

from potluck_lab.cohort_data import SIGN_FLIP, JsonLog, add_task_args, build_task


class SignFlip:
    """A round sum that sends this worker's pseudo-gradient times ``SIGN_FLIP`` in rounds
    ``first`` to ``last - 1``, then hands it to ``inner`` (what modified code could send)."""

    def __init__(self, inner: Any, first: int, last: int, log: Any) -> None:
        self.inner, self.first, self.last, self.log = inner, first, last, log

    def __call__(self, piece: Any, group: Any) -> Future[torch.Tensor]:
        if self.first <= piece.round < self.last:
            piece.delta.mul_(SIGN_FLIP)
            self.log("attack", round=piece.round)
        result: Future[torch.Tensor] = self.inner(piece, group)
        return result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="potluck_lab.cohort_job")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--mode", choices=("rounds", "step"), default="rounds")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--stop-file", type=Path, default=None,
                        help="once it holds a number, the job ends after that many epochs "
                             "(every worker reads it before each step)")
    parser.add_argument("--halt-file", type=Path, default=None,
                        help="once it holds a number S, the job ends once the cohort "
                             "committed S steps (rounds), mid-epoch: the bench's time limit")
    add_task_args(parser)
    parser.add_argument("--inner-steps", type=int, default=10, help="H (rounds mode)")
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument("--attacker-node", type=int, default=None)
    parser.add_argument("--attack-rounds", default="0:0", help="A:B, rounds A to B-1")
    parser.add_argument("--timeout", type=float, default=30.0, help="collective timeout")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    import potluck
    from potluck.compress import Int8Blockwise
    from potluck.sync import DiLoCoSync
    from potluck.testing import SampleLedger
    from potluck.trust import RoundCheck
    from potluck_lab.models import language_model_loss
    from potluck_lab.store_host_job import epochs_to_train

    args = parse_args(argv)
    torch.set_num_threads(1)
    node = int(os.environ.get("GROUP_RANK", "0"))
    stem = args.run_dir / f"node{node}-{os.getpid()}"
    log = JsonLog(stem.with_suffix(".log"))
    task = build_task(args)
    net, adamw, data, hx, hy = task.net, task.optimizer, task.data, task.held_x, task.held_y

    def loss_of(model: Callable[..., Any], batch: Any) -> torch.Tensor:
        loss: torch.Tensor = language_model_loss(model(batch[0]), batch[1])
        return loss

    modes: dict[str, Any] = {}
    if args.mode == "rounds":
        modes = {"sync": potluck.DiLoCo(inner_steps=args.inner_steps, codec=Int8Blockwise()),
                 # (64 samples, not the default 128: the check's forwards are a third of
                 # a round on the 0.3-core host, and the attacker's x-10 stands out at 64)
                 "trust": potluck.Trust(round_check=RoundCheck(loss_of, samples=64))}
    cohort = potluck.init(timeout=args.timeout)
    log("member", node=node, worker=cohort.worker_id, rank=cohort.rank,
        generation=cohort.generation, workers=cohort.world_size, late=cohort.joined_late)
    model, opt, loader = potluck.prepare(net, adamw, data, cohort=cohort,
                                         global_batch=args.global_batch, seed=args.seed,
                                         drop_last=True, clip_grad_norm=1.0,
                                         timeout=args.timeout, **modes)
    first, last = (int(v) for v in args.attack_rounds.split(":"))
    strategy = opt.part(DiLoCoSync)
    if args.attacker_node == node and strategy is not None:
        strategy.register_round_sum(SignFlip(strategy.round_sum, first, last, log))
    trust_part = next((p for p in opt.parts if getattr(p, "name", None) == "trust"), None)
    events = told = 0
    with SampleLedger(stem.with_suffix(".jsonl")) as ledger:
        pending: list[int] = []
        halted = False
        while loader.epoch < epochs_to_train(args.epochs, args.stop_file) and not opt.left \
                and not halted:
            for x, y, ids in loader:
                if loader.epoch >= epochs_to_train(args.epochs, args.stop_file):
                    break  # (admitted at the last boundary: nothing left to train)
                stop_at = halt_at(args.halt_file)
                halted = stop_at is not None and opt.progress.steps >= stop_at
                if halted:
                    log("halt", steps=opt.progress.steps, epoch=loader.epoch)
                    break
                epoch, commits = loader.epoch, opt.progress.steps
                opt.zero_grad()
                loss = loss_of(model, (x, y))
                loss.backward()  # type: ignore[no-untyped-call]
                opt.report(loss=loss.item())  # (the status page's and the plot's curve)
                # before the step: a worker can be killed (or quarantined) inside it
                log("pending", round=commits + 1, epoch=epoch, ids=ids.tolist())
                result = opt.step()
                if result.committed or opt.progress.steps > commits:
                    # (under rounds: this local step, or the round's last one, whose
                    # sync lost a member and was done again by the survivors)
                    pending += ids.tolist()
                for event in cohort.events[events:]:
                    log("event", **event)
                events = len(cohort.events)
                found = list(getattr(trust_part, "events", None) or [])
                for event in found[told:]:
                    log("trust", **event)
                told = len(found)
                if opt.progress.steps > commits:
                    ledger.record(epoch, pending)
                    pending = []
                    record = getattr(strategy, "last", None)
                    log("commit", steps=opt.progress.steps, workers=cohort.world_size,
                        lost=[list(r) for r in record.lost] if record else [])
                    if cohort.rank == 0 and opt.progress.steps % args.eval_every == 0:
                        with torch.no_grad():
                            held_loss = float(loss_of(net, (hx, hy)))
                        log("eval", steps=opt.progress.steps, loss=held_loss,
                            workers=cohort.world_size)
                elif result.failed:
                    pending = []
                    log("failed", round=commits + 1)
    for event in cohort.events[events:]:
        log("event", **event)
    finished = opt.finish()
    if finished:
        torch.save(net.state_dict(), stem.with_suffix(".pt"))
    log("done", finished=bool(finished), left=bool(opt.left))
    log.close()


def halt_at(path: Path | None) -> int | None:
    """The commit count the job ends at: the halt file's number (written whole, at
    once), or None while there is none."""
    if path is None or not path.exists():
        return None
    return int(path.read_text())


if __name__ == "__main__":
    main()
