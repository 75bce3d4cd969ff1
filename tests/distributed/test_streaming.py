"""Streaming DiLoCo on real Gloo ranks (float64), against a replay computed by hand.

Three fragments, four local steps a round: fragment 0 is sent after local step 2 and
received after step 3, when fragment 1 is sent; fragment 1 is received at the round's
end, before fragment 2 is summed there. Each received fragment takes its outer step
(Nesterov) and is merged into the replica with ``mixing`` 0.5. The replay does exactly
that in one process; the ranks' replicas must equal it (rtol 1e-9).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from potluck.testing import free_port, join, run_ranks
from potluck_lab.elastic_job import Indexed, params
from potluck_lab.models import tiny_mlp

SAMPLES, GLOBAL_BATCH, SEED, LR, H, P, MIX = 96, 12, 5, 0.05, 4, 3, 0.5


def _train(rank: int, world_size: int, port: int, codec: str) -> dict[str, Any]:
    from potluck import StreamingDiLoCo, prepare
    from potluck.compress import Int8Blockwise
    from potluck.sync import DiLoCoSync

    cohort = join(rank, world_size, port)
    net = tiny_mlp()
    inner = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    sync = StreamingDiLoCo(H, P, mixing=MIX, adaptive=False,
                           codec=Int8Blockwise(block=64) if codec == "int8" else None)
    model, opt, loader = prepare(net, inner, Indexed(SAMPLES), cohort=cohort,
                                 global_batch=GLOBAL_BATCH, seed=SEED, sync=sync)
    while opt.cursor.epoch < 2:
        for _, x, y in loader:
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    strategy = opt.part(DiLoCoSync)
    assert strategy is not None
    cohort.close()
    return {"params": params(net), "rounds": opt.steps, "sent": strategy.traffic.sent,
            "exchanges": strategy.traffic.exchanges}


def _replay(world: int) -> list[dict[str, torch.Tensor]]:
    """Every rank in lockstep: its local steps; at each fragment's send point the
    weighted pseudo-gradients of that fragment; at its receive point the outer step of
    that fragment alone and the merge."""
    from potluck.data import DataCursor
    from potluck.sync.fragments import deal
    from potluck.sync.round_plan import fragment_points

    data = Indexed(SAMPLES)
    global_net = tiny_mlp()
    globals_ = list(global_net.parameters())
    replicas = [copy.deepcopy(global_net) for _ in range(world)]
    inners = [torch.optim.SGD(r.parameters(), lr=LR, momentum=0.9) for r in replicas]
    outer = torch.optim.SGD(globals_, lr=0.7, momentum=0.9, nesterov=True)
    fragments = deal(len(globals_), P)
    cursor = DataCursor(SAMPLES, H * GLOBAL_BATCH, seed=SEED)

    def sent(f: int) -> list[torch.Tensor]:  # the sum of fragment f's pseudo-gradients
        with torch.no_grad():
            return [sum((globals_[i] - list(r.parameters())[i]) / world for r in replicas)
                    for i in fragments[f]]

    def receive(f: int, summed: list[torch.Tensor]) -> None:
        outer.zero_grad(set_to_none=True)
        for i, value in zip(fragments[f], summed, strict=True):
            globals_[i].grad = value
        outer.step()
        with torch.no_grad():
            for r in replicas:
                for i in fragments[f]:
                    p = list(r.parameters())[i]
                    p.mul_(MIX).add_(globals_[i], alpha=1 - MIX)

    while cursor.epoch < 2:
        block = cursor.global_indices()
        part = len(block) // world
        steps = max(1, round(part * world / GLOBAL_BATCH))
        points = fragment_points(steps, P)
        pending = None
        for step in range(1, steps + 1):
            for r, (replica, inner) in enumerate(zip(replicas, inners, strict=True)):
                mine = block[r * part:(r + 1) * part]
                size = len(mine) // steps
                idx = mine[(step - 1) * size:step * size]
                inner.zero_grad()
                ((replica(data.x[idx]) - data.y[idx]) ** 2).mean().backward()
                inner.step()
            for f, point in enumerate(points):
                if point == step:
                    if pending is not None:
                        receive(*pending)
                    pending = (f, sent(f))
        if pending is not None:
            receive(*pending)
        receive(P - 1, sent(P - 1))
        cursor.commit()
    return [params(r) for r in replicas]


@pytest.mark.timeout(90)
def test_streaming_fragments_are_sent_received_and_merged_in_turn() -> None:
    results = run_ranks(_train, 2, free_port(), "none", init_group=False, timeout=80)
    expected = _replay(2)
    for result, replica in zip(results, expected, strict=True):
        assert result["rounds"] == 2 * SAMPLES // (H * GLOBAL_BATCH)
        assert result["exchanges"] == P * result["rounds"]  # one sum per fragment a round
        for name, value in replica.items():
            torch.testing.assert_close(result["params"][name], value, rtol=1e-9, atol=1e-12)
    # mixing 0.5: the replicas keep half of their own fragments, so they differ
    assert not torch.equal(results[0]["params"]["0.weight"], results[1]["params"]["0.weight"])


@pytest.mark.timeout(90)
def test_streaming_int8_sends_a_quarter_of_the_bytes() -> None:
    plain = run_ranks(_train, 2, free_port(), "none", init_group=False, timeout=80)
    int8 = run_ranks(_train, 2, free_port(), "int8", init_group=False, timeout=80)
    assert plain[0]["sent"] > 3.5 * int8[0]["sent"] > 0
    diff = max(float((int8[0]["params"][n] - v).abs().max())
               for n, v in plain[0]["params"].items())
    assert 1e-9 < diff < 2e-2
