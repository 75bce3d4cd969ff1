"""Streaming DiLoCo on an elastic cohort: a worker lost mid-round voids the round.

Three workers train Streaming DiLoCo rounds (4 global batches, 4 fragments, mixing 0.5,
float64): each worker's 4 local steps send fragment 0 after step 1, take it and send
fragment 1 after step 2, take that and send fragment 2 after step 3, and the round's
sync takes fragment 2 and sums fragment 3. One worker is SIGKILLed in round 1: before
any fragment was sent, after fragment 0 was applied, or inside the last fragment's sum.
Each time the survivors roll the fragments they applied back to the round's start,
form the next generation, and train the whole round again between the two of them.

Checks: every sample of every epoch is in the ledgers of committed samples exactly
once; the survivors' global parameters are bitwise equal; and they equal a one-process
replay in which the voided round never happened, except that each survivor's replica
restarts from the global parameters where the round was voided (with mixing 0.5 a
replica otherwise keeps half of its own fragments). The inner SGD has no momentum, so
the voided local steps leave no state behind in it (float64, rtol 1e-9).
"""

from __future__ import annotations

import copy
import json
import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from potluck.testing import (
    SampleLedger,
    assert_exactly_once,
    assert_replicas_equal,
    hosted_store,
    join_elastic,
    run_ranks,
)
from potluck_lab.elastic_job import Indexed
from potluck_lab.models import tiny_mlp

SAMPLES, GLOBAL_BATCH, EPOCHS, H, P, MIX, LR, SEED = 96, 12, 2, 4, 4, 0.5, 0.1, 5
VICTIM, KILL_ROUND = 2, 1


def _worker(rank: int, world_size: int, port: int, when: str,
            ledger_dir: str) -> dict[str, Any]:
    from potluck import StreamingDiLoCo, prepare
    from potluck.sync import DiLoCoSync

    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=False,
                                       timeout=timedelta(seconds=60))
    cohort = join_elastic(f"worker-{rank}", port, expected=3, timeout=4.0)
    net = tiny_mlp()
    model, opt, loader = prepare(
        net, torch.optim.SGD(net.parameters(), lr=LR), Indexed(SAMPLES),
        global_batch=GLOBAL_BATCH, seed=SEED, cohort=cohort,
        sync=StreamingDiLoCo(H, P, mixing=MIX, adaptive=False))
    strategy = opt.part(DiLoCoSync)
    assert strategy is not None
    if rank == VICTIM:
        _arm(strategy, when, store)
    steps_in_round = {"n": 0}
    pending: list[int] = []
    with SampleLedger(Path(ledger_dir, f"rank{rank}.jsonl")) as out:
        while loader.epoch < EPOCHS:
            for index, x, y in loader:
                if rank == VICTIM and opt.steps == KILL_ROUND:
                    steps_in_round["n"] += 1
                    if (when, steps_in_round["n"]) in (("before fragment 0", 1),
                                                       ("after fragment 0", 3)):
                        _die(strategy, store)
                epoch, commits = loader.epoch, opt.progress.steps
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                result = opt.step()
                pending += index.tolist() if result.committed else []
                if opt.progress.steps > commits:
                    out.record(epoch, pending)
                    pending = []
                elif result.failed:
                    pending = []  # the round is handed out again
    names = [n for n, _ in net.named_parameters()]
    result = {"global": dict(zip(names, strategy.state_dict()["global"], strict=True)),
              "voided": [(v.index, v.applied, v.cause) for v in strategy.voided],
              "steps": opt.steps, "redone": opt.redone, "world_size": cohort.world_size,
              "generation": cohort.generation}
    cohort.close()
    return result


def _die(strategy: Any, store: Any) -> None:
    store.set("applied", str(strategy.applied))  # what the victim itself had applied
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(strategy: Any, when: str, store: Any) -> None:
    """``in the last sum``: die inside round 1's sum of its last fragment, after the
    round's table of speeds and parts went through."""
    if when != "in the last sum":
        return
    summed, last = strategy.round_sum, strategy.config.fragments - 1

    def dying(piece: Any, group: Any) -> Any:
        if strategy.rounds == KILL_ROUND and piece.fragment == last:
            _die(strategy, store)
        return summed(piece, group)

    strategy.register_round_sum(dying)


def _run(tmp_path: Path, when: str) -> list[dict[str, Any]]:
    with hosted_store() as (port, store):
        results = run_ranks(_worker, 3, port, when, str(tmp_path), init_group=False,
                            may_die={VICTIM}, timeout=100)
        victim_applied = int(store.get("applied"))
    assert results[VICTIM] is None
    survivors = [r for r in results if r is not None]
    assert len(survivors) == 2
    for result in survivors:
        assert result["world_size"] == 2 and result["generation"] == 1
        assert result["steps"] == EPOCHS * SAMPLES // (H * GLOBAL_BATCH)
        (index, _, _), = result["voided"]  # the one round, voided once
        assert index == KILL_ROUND + 1 and result["redone"] == 1
    assert_exactly_once(tmp_path, SAMPLES, EPOCHS)
    globals_ = [r["global"] for r in survivors]
    assert_replicas_equal(globals_)
    # Round 0 by the three, then the voided round's restart and every later round by
    # the two survivors; the victim's ledger holds round 0 only.
    ledgers = [[json.loads(line)[1] for line in
                Path(tmp_path, f"rank{rank}.jsonl").read_text().splitlines()]
               for rank in range(3)]
    assert len(ledgers[VICTIM]) == KILL_ROUND
    expected = _replay(ledgers, restart_at=KILL_ROUND)
    for name, value in expected.items():
        torch.testing.assert_close(globals_[0][name], value, rtol=1e-9, atol=1e-12)
    return [{**r, "victim_applied": victim_applied} for r in survivors]


@pytest.mark.timeout(120)
def test_a_worker_lost_before_a_rounds_first_fragment_voids_the_round(
        tmp_path: Path) -> None:
    """The victim dies before its first local step of round 1: the survivors' sum of
    fragment 0 fails mid-round (in ``after_inner_step``), nothing was applied yet, and
    the loss is raised at the round's sync."""
    for result in _run(tmp_path, "before fragment 0"):
        (_, applied, cause), = result["voided"]
        assert applied == 0 and cause.startswith("fragment 0's pseudo-gradient"), cause


@pytest.mark.timeout(120)
def test_a_worker_lost_after_fragment_0_was_applied_rolls_it_back(tmp_path: Path) -> None:
    """The victim dies before its third local step: it had applied fragment 0 and sent
    fragment 1. The survivors had applied fragment 0 too (its sum had the victim's
    part); the round's start comes back, and the result is the replay's."""
    for result in _run(tmp_path, "after fragment 0"):
        assert result["victim_applied"] == 1
        (_, applied, _), = result["voided"]
        assert applied >= 1


@pytest.mark.timeout(120)
def test_a_worker_lost_in_the_last_fragments_sum_voids_the_round(tmp_path: Path) -> None:
    """The victim dies inside the round's sync, after the table of speeds and parts: the
    survivors had applied fragments 0 to 2 and fail in the sum of fragment 3."""
    for result in _run(tmp_path, "in the last sum"):
        assert result["victim_applied"] == P - 1
        (_, applied, cause), = result["voided"]
        assert applied == P - 1 and cause.startswith("the round's pseudo-gradient"), cause


def _replay(ledgers: list[list[list[int]]], restart_at: int) -> dict[str, torch.Tensor]:
    """Every worker in lockstep, round k on each worker's k-th ledger entry: its local
    steps; at each fragment's send point the weighted pseudo-gradients of that fragment
    are summed; at its receive point that fragment alone takes its outer step and is
    merged into each replica. Before round ``restart_at`` every replica takes the
    global parameters (the voided round's only trace)."""
    from potluck.data.split import equal_shares, split_counts
    from potluck.sync import local_steps
    from potluck.sync.fragments import deal
    from potluck.sync.round_plan import fragment_points

    data, global_net = Indexed(SAMPLES), tiny_mlp()
    globals_ = list(global_net.parameters())
    replicas = [copy.deepcopy(global_net) for _ in ledgers]
    outer = torch.optim.SGD(globals_, lr=0.7, momentum=0.9, nesterov=True)
    fragments = deal(len(globals_), P)

    def send(f: int, parts: dict[int, list[int]], total: int) -> list[torch.Tensor]:
        with torch.no_grad():
            return [sum(len(part) / total * (globals_[i] - list(replicas[w].parameters())[i])
                        for w, part in parts.items()) for i in fragments[f]]

    def receive(f: int, summed: list[torch.Tensor], parts: dict[int, list[int]]) -> None:
        outer.zero_grad(set_to_none=True)
        for i, value in zip(fragments[f], summed, strict=True):
            globals_[i].grad = value
        outer.step()
        with torch.no_grad():
            for w in parts:
                for i in fragments[f]:
                    list(replicas[w].parameters())[i].mul_(MIX).add_(globals_[i],
                                                                     alpha=1 - MIX)

    for k in range(max(len(ledger) for ledger in ledgers)):
        if k == restart_at:
            with torch.no_grad():
                for replica in replicas:
                    for p, g in zip(replica.parameters(), globals_, strict=True):
                        p.copy_(g)
        parts = {w: ledger[k] for w, ledger in enumerate(ledgers) if k < len(ledger)}
        total = sum(len(part) for part in parts.values())
        steps = {w: local_steps(len(part), GLOBAL_BATCH, len(parts))
                 for w, part in parts.items()}
        assert len(set(steps.values())) == 1  # equal shares: the ranks in lockstep
        count = next(iter(steps.values()))
        batches = {w: split_counts(len(part), equal_shares(count)) for w, part in parts.items()}
        pending = None
        for step in range(count):
            for w, part in parts.items():
                offset = sum(batches[w][:step])
                idx = part[offset:offset + batches[w][step]]
                replica = replicas[w]
                replica.zero_grad()
                ((replica(data.x[idx]) - data.y[idx]) ** 2).mean().backward()
                with torch.no_grad():
                    for p in replica.parameters():
                        p.sub_(LR * p.grad)
            for f, point in enumerate(fragment_points(count, P)):
                if point == step + 1:
                    if pending is not None:
                        receive(*pending)
                    pending = (f, send(f, parts, total), parts)
        if pending is not None:
            receive(*pending)
        receive(P - 1, send(P - 1, parts, total), parts)
    return {n: p.detach().clone() for n, p in global_net.named_parameters()}
