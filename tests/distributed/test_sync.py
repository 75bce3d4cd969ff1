"""DiLoCo and Local SGD on real Gloo ranks (float64), against references computed by hand.

- Local SGD with one local step a round (outer SGD, lr 1, no momentum) and plain inner
  SGD is every-step synchronous training: it equals one process on the same global
  batches (rtol 1e-9).
- DiLoCo (outer Nesterov SGD, inner SGD with momentum, each rank's inner state its own)
  with one rank made slow: the first round starts even, the ranks exchange speeds and
  split its rest by them, and the plan gives the fast rank more local steps; whatever
  the plan was segment by segment, the parameters equal a one-process replay of it:
  each rank's local steps on its parts of the round, pseudo-gradients weighted by
  samples, the outer step (rtol 1e-9).
- int8 pseudo-gradients with error feedback stay close to the uncompressed run and send
  about 4x fewer bytes.
"""

from __future__ import annotations

import copy
import io
import time
from typing import Any

import pytest
import torch
from torch import nn

from potluck.testing import free_port, join, run_ranks
from potluck_lab.elastic_job import Indexed, params
from potluck_lab.models import tiny_mlp

SAMPLES, GLOBAL_BATCH, SEED, LR = 96, 12, 5, 0.05


class Slow(nn.Module):
    """Rank 1's model: the same MLP, a sleep per sample in its forward."""

    def __init__(self, inner: nn.Module, pause: float) -> None:
        super().__init__()
        self.inner, self.pause = inner, pause

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pause:
            time.sleep(self.pause * len(x))
        return self.inner(x)  # type: ignore[no-any-return]


def _train(rank: int, world_size: int, port: int, kind: str) -> dict[str, Any]:
    from potluck import DiLoCo, LocalSGD, prepare
    from potluck.compress import Int8Blockwise
    from potluck.errors import ConfigError

    cohort = join(rank, world_size, port)
    # (10 ms a sample: a gap that contention on a loaded 2-core machine does not close;
    # with 2 ms, rank 0 slowed by other jobs measured slower in a round now and then)
    net = Slow(tiny_mlp(), 0.01 if rank == 1 and kind == "slow" else 0.0)
    momentum = 0.0 if kind == "local" else 0.9
    inner = torch.optim.SGD(net.parameters(), lr=LR, momentum=momentum)
    sync = {"local": LocalSGD(1, adaptive=False),
            "slow": DiLoCo(inner_steps=4, min_gain=0.0, measure=0.25),
            "int8": DiLoCo(inner_steps=4, adaptive=False, codec=Int8Blockwise(block=64)),
            "plain": DiLoCo(inner_steps=4, adaptive=False),
            "round sum": DiLoCo(inner_steps=4, adaptive=False)}[kind]
    model, opt, loader = prepare(net, inner, Indexed(SAMPLES), cohort=cohort,
                                 global_batch=GLOBAL_BATCH, seed=SEED, sync=sync)
    pieces: list[tuple[int, int, float]] = []
    refused = ""
    if kind == "round sum":  # the seam: a round sum that wraps the default one
        strategy = opt.part(type(opt.parts[0]))
        inner_sum = strategy.round_sum

        def recording(piece: Any, group: Any) -> Any:
            pieces.append((piece.round, piece.fragment, piece.share))
            return inner_sum(piece, group)

        strategy.register_round_sum(recording)
        try:
            strategy.register_round_sum(42)
        except ConfigError as exc:
            refused = str(exc)
    # round by round, its segments: samples per rank, and this rank's local steps
    rounds: list[list[tuple[list[int], int]]] = [[]]
    while opt.cursor.epoch < 2:
        for _, x, y in loader:
            segments = rounds[-1]
            if len(segments) == loader.segment:  # the round's next segment begins
                segments.append((list(loader.split), 0))
            segments[-1] = (segments[-1][0], segments[-1][1] + 1)
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            before = opt.steps
            opt.step()
            if opt.steps != before:  # the round committed
                rounds.append([])
    rounds.pop()
    strategy = opt.part(type(opt.parts[0]))
    cohort.close()
    return {"params": params(net.inner), "rounds": rounds,
            "sent": strategy.traffic.sent if strategy else 0, "steps": opt.steps,
            "pieces": pieces, "refused": refused}


def _replay(rounds: list[list[list[tuple[list[int], int]]]], *, inner_steps: int,
            momentum: float, outer_lr: float, outer_momentum: float,
            nesterov: bool) -> dict[str, torch.Tensor]:
    """One process: each rank's local steps on its parts of the round (``rounds[r][k]``:
    rank r's segments of round k, the split and its local steps), the weighted outer
    step."""
    from potluck.data import DataCursor
    from potluck.data.split import equal_shares, split_counts

    data, world = Indexed(SAMPLES), len(rounds)
    global_net = tiny_mlp()
    replicas = [copy.deepcopy(global_net) for _ in range(world)]
    inners = [torch.optim.SGD(r.parameters(), lr=LR, momentum=momentum) for r in replicas]
    outer = torch.optim.SGD(global_net.parameters(), lr=outer_lr, momentum=outer_momentum,
                            nesterov=nesterov)
    cursor = DataCursor(SAMPLES, inner_steps * GLOBAL_BATCH, seed=SEED)
    for k in range(len(rounds[0])):
        block = cursor.global_indices()
        samples = [0] * world
        for r in range(world):
            start = 0
            for split, steps in rounds[r][k]:
                part = block[start + sum(split[:r]):start + sum(split[:r + 1])]
                start += sum(split)
                samples[r] += len(part)
                offset = 0
                for count in split_counts(len(part), equal_shares(steps)):
                    idx = part[offset:offset + count]
                    offset += count
                    inners[r].zero_grad()
                    ((replicas[r](data.x[idx]) - data.y[idx]) ** 2).mean().backward()
                    inners[r].step()
            assert start == len(block)
        outer.zero_grad()
        with torch.no_grad():
            for name, g in global_net.named_parameters():
                locals_ = [dict(replica.named_parameters())[name] for replica in replicas]
                g.grad = sum(samples[r] / len(block) * (g - locals_[r]) for r in range(world))
        outer.step()
        with torch.no_grad():
            for replica in replicas:
                for p, g in zip(replica.parameters(), global_net.parameters(), strict=True):
                    p.copy_(g)
        cursor.commit()
    return params(global_net)


def _close(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=1e-9, atol=1e-12)


@pytest.mark.timeout(90)
def test_local_sgd_with_one_local_step_equals_one_process() -> None:
    from potluck_lab.elastic_job import ElasticJob

    results = run_ranks(_train, 2, free_port(), "local", init_group=False, timeout=80)
    job = ElasticJob(samples=SAMPLES, global_batch=GLOBAL_BATCH, epochs=2, data_seed=SEED)
    # the reference: one process, plain SGD on each global batch
    from potluck.data import DataCursor

    net, data = tiny_mlp(), Indexed(job.samples)
    sgd = torch.optim.SGD(net.parameters(), lr=LR)
    cursor = DataCursor(SAMPLES, GLOBAL_BATCH, seed=SEED)
    for _ in range(2 * SAMPLES // GLOBAL_BATCH):
        idx = cursor.global_indices()
        sgd.zero_grad()
        ((net(data.x[idx]) - data.y[idx]) ** 2).mean().backward()
        sgd.step()
        cursor.commit()
    for result in results:
        assert result["steps"] == 2 * SAMPLES // GLOBAL_BATCH
        assert [[steps for _, steps in segments] for segments in result["rounds"]] \
            == [[1]] * result["steps"]
        _close(result["params"], params(net))


@pytest.mark.serial
@pytest.mark.timeout(120)
def test_uneven_local_steps_are_weighted_by_samples_exactly() -> None:
    results = run_ranks(_train, 2, free_port(), "slow", init_group=False, timeout=110)
    splits = [[split for split, _ in segments] for segments in results[0]["rounds"]]
    assert all([[split for split, _ in segments] for segments in r["rounds"]] == splits
               for r in results)
    # the first round starts even (measure=0.25: one global batch of 12, one local step
    # each), the speeds are exchanged, and the fast rank 0 takes more of the rest
    first = [r["rounds"][0] for r in results]
    assert splits[0][0] == [6, 6] and first[0][0][1] == first[1][0][1] == 1
    assert len(splits[0]) == 2 and splits[0][1][0] > splits[0][1][1]
    assert first[0][1][1] > first[1][1][1] >= 1
    # later rounds are planned from the start: one segment, the fast rank more
    assert all(len(s) == 1 and s[0][0] > s[0][1] for s in splits[1:])
    expected = _replay([r["rounds"] for r in results], inner_steps=4, momentum=0.9,
                       outer_lr=0.7, outer_momentum=0.9, nesterov=True)
    for result in results:
        _close(result["params"], expected)


@pytest.mark.timeout(120)
def test_int8_pseudo_gradients_stay_close_and_send_a_quarter() -> None:
    plain = run_ranks(_train, 2, free_port(), "plain", init_group=False, timeout=80)
    int8 = run_ranks(_train, 2, free_port(), "int8", init_group=False, timeout=80)
    assert torch.equal(int8[0]["params"]["0.weight"], int8[1]["params"]["0.weight"])
    diff = max(float((int8[0]["params"][n] - v).abs().max())
               for n, v in plain[0]["params"].items())
    assert 1e-9 < diff < 1e-2
    assert plain[0]["sent"] > 3.5 * int8[0]["sent"] > 0


def _one_worker(rank: int, world_size: int, port: int) -> dict[str, Any]:
    from potluck import LocalSGD, prepare
    from potluck.errors import ConfigError

    cohort = join(rank, world_size, port)
    net = tiny_mlp()
    inner = torch.optim.SGD(net.parameters(), lr=0.0)  # the replica never moves by itself
    model, opt, loader = prepare(net, inner, Indexed(SAMPLES), cohort=cohort,
                                 global_batch=GLOBAL_BATCH, seed=SEED, sync=LocalSGD(2))
    with torch.no_grad():  # weights loaded after prepare() are the global ones
        for p in net.parameters():
            p.fill_(0.5)
    batches = iter(loader)
    for _ in range(2):
        _, x, y = next(batches)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    kept = all(bool((p == 0.5).all()) for p in net.parameters())
    next(batches)  # a batch of round 2 whose step is skipped, then round 2 again: refused
    try:
        next(batches)
        next(batches)
        refused = ""
    except ConfigError as exc:
        refused = str(exc)
    cohort.close()
    return {"kept": kept, "rounds": opt.steps, "refused": refused}


@pytest.mark.timeout(60)
def test_a_registered_round_sum_gets_every_round_and_wrapping_the_default_changes_nothing(
        ) -> None:
    plain = run_ranks(_train, 2, free_port(), "plain", init_group=False, timeout=80)
    wrapped = run_ranks(_train, 2, free_port(), "round sum", init_group=False, timeout=80)
    for a, b in zip(plain, wrapped, strict=True):
        for name, value in a["params"].items():
            assert torch.equal(value, b["params"][name]), name
    rounds = SAMPLES * 2 // (4 * GLOBAL_BATCH)  # two epochs of rounds of 4 global batches
    for result in wrapped:  # one piece a round (one dtype, one fragment), half the samples
        assert result["pieces"] == [(r, 0, 0.5) for r in range(1, rounds + 1)]
        assert "pass a RoundSum" in result["refused"]


def test_one_worker_keeps_weights_loaded_after_prepare_and_refuses_a_skipped_step() -> None:
    result = run_ranks(_one_worker, 1, free_port(), init_group=False, timeout=50)[0]
    assert result["kept"] and result["rounds"] == 1
    assert "after 0 optimizer step(s) of its 2 batches" in result["refused"]
    assert "call opt.step() once per batch" in result["refused"]


def _rounds_with_resume(rank: int, world_size: int, port: int,
                        state: bytes | None) -> dict[str, Any]:
    """3 rounds of 36 samples an epoch (36, 36 and a short 24), 2 epochs; with no
    ``state``, the live state after round 3 is returned too, as a checkpoint's bytes
    (tensors handed to a process directly would share memory between the ranks)."""
    from potluck import DiLoCo, prepare

    cohort = join(rank, world_size, port)
    net = tiny_mlp()
    inner = torch.optim.SGD(net.parameters(), lr=LR)
    model, opt, loader = prepare(net, inner, Indexed(SAMPLES), cohort=cohort,
                                 global_batch=GLOBAL_BATCH, seed=SEED,
                                 sync=DiLoCo(inner_steps=3, adaptive=False))
    if state is not None:
        opt.load_state_dict(torch.load(io.BytesIO(state)))
    saved, local, steps_here = None, [], 0
    while opt.cursor.epoch < 2:
        for _, x, y in loader:
            steps_here += 1
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            before = opt.steps
            opt.step()
            if opt.steps != before:
                local.append(steps_here)
                steps_here = 0
                if opt.steps == 3 and state is None:
                    buffer = io.BytesIO()  # now: state_dict() holds references, as torch's
                    torch.save(opt.state_dict(), buffer)
                    saved = buffer.getvalue()
    cohort.close()
    return {"params": params(net), "saved": saved, "local": local, "rounds": opt.steps}


@pytest.mark.timeout(120)
def test_a_resumed_diloco_run_equals_the_uninterrupted_one() -> None:
    """Resumed from the live state at a round boundary (global parameters, outer
    momentum, plan, cursor), the run ends bitwise where the uninterrupted one did; the
    epoch's short last round takes fewer local steps."""
    whole = run_ranks(_rounds_with_resume, 2, free_port(), None, init_group=False,
                      timeout=100)
    assert whole[0]["rounds"] == 6 and whole[0]["local"] == [3, 3, 2, 3, 3, 2]
    resumed = run_ranks(_rounds_with_resume, 2, free_port(), whole[0]["saved"],
                        init_group=False, timeout=100)
    assert resumed[0]["rounds"] == 6 and resumed[0]["local"] == [3, 3, 2]
    for got in resumed:
        for name, value in whole[0]["params"].items():
            assert torch.equal(got["params"][name], value), name


def _stop_mid_round(rank: int, world_size: int, port: int,
                    state: bytes | None) -> dict[str, Any]:
    """With no ``state``: one round of 4 local steps, then a break after one more local
    step and ``finish()``; the live state after the round comes back as bytes. With a
    ``state`` (rank 0's): a new process takes it, and says what error feedback it has."""
    import logging

    from potluck import DiLoCo, prepare
    from potluck.compress import Int8Blockwise

    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("potluck.step.transaction").addHandler(handler)
    cohort = join(rank, world_size, port)
    net = tiny_mlp()
    model, opt, loader = prepare(net, torch.optim.SGD(net.parameters(), lr=LR),
                                 Indexed(SAMPLES), cohort=cohort, global_batch=GLOBAL_BATCH,
                                 seed=SEED, sync=DiLoCo(inner_steps=4, adaptive=False,
                                                        codec=Int8Blockwise(block=64)))
    strategy = opt.part(type(opt.parts[0]))
    if state is not None:
        opt.load_state_dict(torch.load(io.BytesIO(state)))
        feedback = strategy.feedback.state_dict()
        opt.finish()
        return {"feedback": feedback}
    saved, after_round = None, {}
    for local, (_, x, y) in enumerate(loader, start=1):
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        if local == 4:  # the round committed
            buffer = io.BytesIO()
            torch.save(opt.state_dict(), buffer)
            saved, after_round = buffer.getvalue(), params(net)
        if local == 5:
            break
    opt.finish()
    return {"params": params(net), "after_round": after_round, "saved": saved, "said": said,
            "feedback": strategy.feedback.state_dict()}


@pytest.mark.timeout(120)
def test_a_loop_stopped_mid_round_leaves_the_global_model_and_feedback_stays_own() -> None:
    """finish() with local steps not synced says so and puts every replica back at the
    global parameters (they would differ); a worker takes a saved residual only if it is
    its own rank's, so a resumed rank 1 does not count rank 0's residual again."""
    stopped = run_ranks(_stop_mid_round, 2, free_port(), None, init_group=False, timeout=100)
    for got in stopped:
        assert any("finish() with 1 local step(s) of a round not synced" in m
                   for m in got["said"]), got["said"]
        for name, value in stopped[0]["after_round"].items():
            assert torch.equal(got["params"][name], value), name  # the global model
    assert stopped[0]["feedback"] and stopped[1]["feedback"]  # each rank's own residual
    resumed = run_ranks(_stop_mid_round, 2, free_port(), stopped[0]["saved"],
                        init_group=False, timeout=100)
    saved = torch.load(io.BytesIO(stopped[0]["saved"]))["parts"]["sync"]["feedback"]
    assert resumed[1]["feedback"] == {}  # rank 0's is not rank 1's
    assert resumed[0]["feedback"].keys() == saved.keys()
    assert all(torch.equal(resumed[0]["feedback"][k], saved[k]) for k in saved)
