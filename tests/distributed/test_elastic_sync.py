"""DiLoCo on an elastic cohort: a worker lost mid-round does not cost the round.

Three workers train DiLoCo rounds (2 global batches each, float64); one is SIGKILLed
after its first local step of the second round. The survivors' sync fails, they form
the next generation and commit the round among themselves, weighted by their samples;
the positions the lost worker had trained on since the last sync never reached the
global model, so the cursor hands them out again as a round of their own. The ledgers
of committed samples then hold every sample of every epoch exactly once, and the
survivors' replicas are equal and equal a one-process replay of what each worker
committed, weighted by samples (float64, rtol 1e-9).
"""

from __future__ import annotations

import copy
import json
import os
import signal
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from potluck.data import DataCursor
from potluck.sync import DiLoCoSync
from potluck.testing import assert_exactly_once, assert_replicas_equal, free_port, run_ranks
from potluck_lab.elastic_job import (
    ElasticJob,
    Indexed,
    params,
    start_worker,
    train,
    wait_for_joiner,
)
from potluck_lab.models import tiny_mlp

# 48 samples, rounds of 2 x 12: two rounds an epoch, 8 samples (2 local steps) a rank.
JOB = ElasticJob(epochs=2, inner_steps=2, collective_timeout=4.0)
VICTIM, KILL_ROUND = 2, 1


def _worker(rank: int, world_size: int, port: int, ledger_dir: str) -> dict[str, Any]:
    worker = start_worker(JOB, f"worker-{rank}", "127.0.0.1", port)
    calls = {"n": 0}

    def inject(rounds: int) -> None:
        if rank == VICTIM and rounds == KILL_ROUND:
            calls["n"] += 1
            if calls["n"] == 2:  # one local step of the round done, one to go: mid-round
                os.kill(os.getpid(), signal.SIGKILL)

    return train(worker, JOB, Path(ledger_dir, f"rank{rank}.jsonl"), inject)


def _three_one_killed(worker: Any, tmp_path: Path) -> list[dict[str, Any]]:
    """Three workers on a store of this process's, ``VICTIM`` killing itself: the
    survivors' results."""
    from torch.distributed import TCPStore

    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=30))
    results = run_ranks(worker, 3, port, str(tmp_path), init_group=False, may_die={VICTIM},
                        timeout=100)
    del store
    assert results[VICTIM] is None  # the victim died
    survivors = [r for r in results if r is not None]
    assert len(survivors) == 2
    return survivors


def _once_and_equal(tmp_path: Path, job: ElasticJob, survivors: list[dict[str, Any]]) -> None:
    """Every sample of every epoch once in the ledgers; the survivors' replicas equal."""
    assert_exactly_once(tmp_path, job.samples, job.epochs)
    assert_replicas_equal([s["params"] for s in survivors])


@pytest.mark.timeout(120)
def test_worker_lost_mid_round_survivors_commit_it_and_every_sample_counts_once(
        tmp_path: Path) -> None:
    survivors = _three_one_killed(_worker, tmp_path)
    # What the victim had: its part of round 0 (its ledger), and the same part of round 1
    # (equal shares, the same cohort rank), 24 positions on.
    (epoch, indices), = (json.loads(line) for line in
                         Path(tmp_path, f"rank{VICTIM}.jsonl").read_text().splitlines())
    perm = DataCursor(JOB.samples, JOB.inner_steps * JOB.global_batch,
                      seed=JOB.data_seed).permutation(0).tolist()
    first_pos = perm.index(indices[0])
    assert epoch == 0 and perm[first_pos:first_pos + 8] == indices
    for result in survivors:
        assert result["world_size"] == 2 and result["generation"] == 1
        assert result["lost"] == [[first_pos + 24, first_pos + 32]]
        # 2 rounds an epoch, 2 epochs: round 1 counts once its owed part is trained
        assert result["steps"] == 4
    _once_and_equal(tmp_path, JOB, survivors)
    first = survivors[0]["params"]
    # The weights: a one-process replay of what the ledgers say each worker committed,
    # each round's pseudo-gradients weighted by samples over the participants' samples.
    ledgers = [[json.loads(line)[1] for line in
                Path(tmp_path, f"rank{rank}.jsonl").read_text().splitlines()]
               for rank in range(3)]
    expected = _replay(ledgers, worlds=[3, 3, 2, 2, 2])
    for name, value in expected.items():
        torch.testing.assert_close(first[name], value, rtol=1e-9, atol=1e-12)


MEASURED = replace(JOB, epochs=1, measure=0.5)


def _lost_after_the_speeds(rank: int, world_size: int, port: int,
                           ledger_dir: str) -> dict[str, Any]:
    worker = start_worker(MEASURED, f"worker-{rank}", "127.0.0.1", port)
    strategy = worker.optimizer.part(DiLoCoSync)
    assert strategy is not None
    calls = {"n": 0}

    def inject(rounds: int) -> None:
        # The victim's first local step is the round's even start; the speeds are
        # exchanged after it; it dies before its first local step of the rest.
        if rank == VICTIM and rounds == 0:
            calls["n"] += 1
            if calls["n"] == 2:
                assert strategy.plan is not None  # the speeds arrived
                os.kill(os.getpid(), signal.SIGKILL)

    return train(worker, MEASURED, Path(ledger_dir, f"rank{rank}.jsonl"), inject)


@pytest.mark.timeout(120)
def test_a_worker_lost_after_a_rounds_even_start_takes_both_its_parts(
        tmp_path: Path) -> None:
    """The first round starts even (one global batch), the speeds are exchanged, the
    rest is split by them; the victim dies in the rest. The survivors commit the round
    and owe both of the victim's parts (its even start and its share of the rest): every
    sample once, replicas equal."""
    survivors = _three_one_killed(_lost_after_the_speeds, tmp_path)
    assert not Path(tmp_path, f"rank{VICTIM}.jsonl").read_text()  # it committed nothing
    committed = [json.loads(Path(tmp_path, f"rank{rank}.jsonl").read_text().splitlines()[0])
                 for rank in range(2)]
    round_size = MEASURED.inner_steps * MEASURED.global_batch
    for result in survivors:
        assert result["world_size"] == 2 and result["generation"] == 1
        lost = result["lost"]
        # the victim's part of the even start (a third of its 12) and of the rest (its
        # cohort rank, so where its parts lie, follows the order the workers joined in)
        assert len(lost) == 2 and lost[0] in ([0, 4], [4, 8], [8, 12]), lost
        assert 12 <= lost[1][0] < lost[1][1] <= round_size
        assert sum(b - a for a, b in lost) == round_size - sum(len(c[1]) for c in committed)
        assert lost == survivors[0]["lost"]
    _once_and_equal(tmp_path, MEASURED, survivors)


def _lost_before_the_speeds(rank: int, world_size: int, port: int,
                            ledger_dir: str) -> dict[str, Any]:
    worker = start_worker(MEASURED, f"worker-{rank}", "127.0.0.1", port)

    def inject(rounds: int) -> None:
        if rank == VICTIM and rounds == 0:  # its one local step of the even start
            os.kill(os.getpid(), signal.SIGKILL)

    return train(worker, MEASURED, Path(ledger_dir, f"rank{rank}.jsonl"), inject)


@pytest.mark.timeout(120)
def test_a_worker_lost_in_the_speed_exchange_leaves_the_rest_even_and_is_owed(
        tmp_path: Path) -> None:
    """The victim dies in the round's even start: the others' speed exchange fails, they
    train the rest evenly (a third each, the victim's third included), the loss is
    raised at the round's sync before any collective, and the survivors commit the
    round in the next generation, owing the victim's two parts (a third of the start
    and a third of the rest). Every sample once, replicas equal."""
    survivors = _three_one_killed(_lost_before_the_speeds, tmp_path)
    for result in survivors:
        assert result["world_size"] == 2 and result["generation"] == 1
        assert result["lost"] in ([[4 * r, 4 * r + 4], [12 + 4 * r, 16 + 4 * r]]
                                  for r in range(3)), result["lost"]
        assert result["lost"] == survivors[0]["lost"]
    _once_and_equal(tmp_path, MEASURED, survivors)


JOIN_JOB = replace(JOB, epochs=3, expected=2, collective_timeout=20.0)
TRAINING_KEY = "test/founders-train"


def _join(rank: int, world_size: int, port: int, ledger_dir: str) -> dict[str, Any]:
    from torch.distributed import TCPStore

    # Rank 2 joins once the founders train; they wait for it at round 1's first local
    # step, so it is admitted at the round's end on any machine.
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=100))
    worker = start_worker(JOIN_JOB, f"worker-{rank}", "127.0.0.1", port,
                          before_join=(lambda: store.wait([TRAINING_KEY]))
                          if rank == 2 else None)
    waited = {"done": False}

    def hook(rounds: int) -> None:
        if rank == 0 and rounds == 1:
            store.set(TRAINING_KEY, "1")
        if rank < 2 and rounds == 1 and not waited["done"]:
            wait_for_joiner(worker.cohort)
            waited["done"] = True

    result = train(worker, JOIN_JOB, Path(ledger_dir, f"rank{rank}.jsonl"), hook)
    outer = worker.optimizer.part(DiLoCoSync)
    assert outer is not None
    result["outer"] = outer.state_dict()["outer"]
    return result


@pytest.mark.timeout(120)
def test_a_joiner_takes_the_global_parameters_and_the_outer_optimizer(tmp_path: Path) -> None:
    """Admitted at a round's boundary, a joiner takes the live state (the global
    parameters, the outer optimizer's momentum, the cursor) and trains the next round
    as an equal: the three replicas and outer optimizers end equal, every sample once."""
    from torch.distributed import TCPStore

    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=30))
    results = run_ranks(_join, 3, port, str(tmp_path), init_group=False, timeout=100)
    del store
    assert [r["joined_late"] for r in results] == [False, False, True]
    assert {r["world_size"] for r in results} == {3}
    assert_exactly_once(tmp_path, JOIN_JOB.samples, JOIN_JOB.epochs)
    assert_replicas_equal([r["params"] for r in results])
    for other in results[1:]:
        momenta = [s["momentum_buffer"] for s in other["outer"]["state"].values()]
        expected = [s["momentum_buffer"] for s in results[0]["outer"]["state"].values()]
        assert len(momenta) == len(expected) > 0
        assert all(torch.equal(a, b) for a, b in zip(momenta, expected, strict=True))


def _replay(ledgers: list[list[list[int]]], worlds: list[int]) -> dict[str, torch.Tensor]:
    """Each worker a replica with its own inner SGD (momentum 0.9, lr 0.1, as
    ``start_worker``); round k: every worker with a k-th ledger entry trains its local
    steps on it, the outer Nesterov SGD (DiLoCo's defaults) takes the pseudo-gradients
    weighted by samples. A round's local steps follow the world size it began with."""
    from potluck import DiLoCo
    from potluck.data.split import equal_shares, split_counts
    from potluck.sync import local_steps

    config, data = DiLoCo(JOB.inner_steps), Indexed(JOB.samples)
    global_net = tiny_mlp()
    replicas = [copy.deepcopy(global_net) for _ in ledgers]
    inners = [torch.optim.SGD(r.parameters(), lr=0.1, momentum=0.9) for r in replicas]
    outer = torch.optim.SGD(global_net.parameters(), lr=config.outer_lr,
                            momentum=config.outer_momentum, nesterov=config.nesterov)
    for k, world in enumerate(worlds):
        parts = {w: ledger[k] for w, ledger in enumerate(ledgers) if k < len(ledger)}
        total = sum(len(part) for part in parts.values())
        for w, part in parts.items():
            steps = local_steps(len(part), JOB.global_batch, world)
            offset = 0
            for count in split_counts(len(part), equal_shares(steps)):
                idx = part[offset:offset + count]
                offset += count
                inners[w].zero_grad()
                ((replicas[w](data.x[idx]) - data.y[idx]) ** 2).mean().backward()
                inners[w].step()
        outer.zero_grad()
        with torch.no_grad():
            for name, g in global_net.named_parameters():
                g.grad = sum(len(part) / total * (g - dict(replicas[w].named_parameters())[name])
                             for w, part in parts.items())
        outer.step()
        with torch.no_grad():
            for replica in replicas:
                for p, g in zip(replica.parameters(), global_net.parameters(), strict=True):
                    p.copy_(g)
    return params(global_net)
