"""Compressed sums on real Gloo ranks.

- Every route (all-reduce of a cast, all-gather of int8 and top-k with 2 ranks, the
  scatter of int8 with 3): each rank ends with the same tensor, bitwise, and it is the
  sum of what each rank's payload decodes to (the owner's re-encoded slice for a scatter).
- ``CompressedSum`` as the reducer's hook under ``potluck.prepare`` with shares that
  change every few steps: with the identity codec the result equals one process
  (float64, rtol 1e-9), so the reducer's weighting reaches a summing hook; with int8 and
  error feedback it stays close to it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from potluck.testing import free_port, join, run_ranks
from potluck_lab.elastic_job import (
    ElasticJob,
    Indexed,
    max_param_diff,
    params,
    single_process,
)
from potluck_lab.models import tiny_mlp
from tests.distributed.scripted import ScriptedShares


def _codecs() -> dict[str, Any]:
    from potluck.compress import Fp16, Identity, Int8Blockwise, TopK

    return {"none": Identity(), "fp16": Fp16(), "int8": Int8Blockwise(block=32),
            "topk": TopK(fraction=0.1)}


def _sums(rank: int, world_size: int) -> dict[str, Any]:
    import torch.distributed as dist

    from potluck.compress import ErrorFeedback, Traffic, reduce_sum, route

    group = dist.distributed_c10d._get_default_group()
    x = torch.randn(1001, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
    out: dict[str, Any] = {"x": x}
    for name, codec in _codecs().items():
        traffic, feedback = Traffic(), ErrorFeedback()
        out[name] = reduce_sum(x, codec, group, feedback=feedback, key="k", traffic=traffic)
        out[name + "/route"] = route(codec, world_size)
        out[name + "/sent"] = traffic.sent
        out[name + "/residual"] = feedback.residual("k")  # None for a scatter (sliced)
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world_size", [2, 3])  # int8: all-gather with 2, scatter with 3
def test_every_route_gives_every_rank_the_same_decoded_sum(world_size: int) -> None:
    results = run_ranks(_sums, world_size, timeout=80)
    codecs = _codecs()
    xs = [r["x"] for r in results]
    for name in codecs:
        got = results[0][name]
        for r in results[1:]:
            assert torch.equal(r[name], got), f"{name}: ranks disagree"
        exact = sum(xs)
        if results[0][name + "/route"] != "scatter":
            # the sum of each rank's own payload, decoded (its residual is what it kept)
            decoded = sum(x - r[name + "/residual"] for x, r in zip(xs, results, strict=True))
            # fp16: the sum itself is taken in fp16, a rounding per addition
            atol = 2**-10 * world_size * float(decoded.abs().max()) if name == "fp16" else 1e-12
            torch.testing.assert_close(got, decoded, rtol=0, atol=atol)
        if name == "none":
            torch.testing.assert_close(got, exact, rtol=1e-12, atol=1e-12)
        elif name in ("fp16", "int8"):
            assert float((got - exact).abs().max()) < 0.1 * world_size, name
    assert results[0]["int8/route"] == ("allgather" if world_size == 2 else "scatter")
    assert results[0]["none/sent"] > 3.5 * results[0]["int8/sent"]  # 1 scale per 32 codes


JOB = ElasticJob(samples=48, global_batch=12, epochs=2)


# shares that change every 2 steps (so the reducer's weights move under the hook)
SHARE_PLANS = ((1.0, 3.0, 2.0), (2.0, 1.0, 1.0), (1.0, 1.0, 1.0))


def _train(rank: int, world_size: int, port: int, codec_name: str) -> dict[str, Any]:
    from potluck import prepare
    from potluck.compress import CompressedSum

    cohort = join(rank, world_size, port)
    net = tiny_mlp()
    hook = CompressedSum(_codecs()[codec_name])
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    model, opt, loader = prepare(net, sgd, Indexed(JOB.samples), global_batch=JOB.global_batch,
                                 seed=JOB.data_seed, comm_hook=hook, cohort=cohort,
                                 shares=ScriptedShares(SHARE_PLANS, every=2))
    splits = []
    while opt.cursor.epoch < JOB.epochs:
        for _, x, y in loader:
            splits.append(list(loader.split))
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            assert opt.step().committed
    cohort.close()
    return {"params": params(model.module), "splits": splits, "sent": hook.traffic.sent}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("codec_name,tolerance,world_size",
                         [("none", 1e-12, 2), ("int8", 2e-2, 3)])
def test_compressed_hook_under_prepare_keeps_the_exact_weights(codec_name: str,
                                                                 tolerance: float,
                                                                 world_size: int) -> None:
    """With 3 ranks int8 goes by the scatter route, inside backward."""
    results = run_ranks(_train, world_size, free_port(), codec_name, init_group=False,
                        timeout=80)
    if world_size == 2:
        assert results[0]["splits"][0] == [3, 9] and results[0]["splits"][2] == [8, 4]
    else:
        assert results[0]["splits"][0] == [2, 6, 4] and results[0]["splits"][2] == [6, 3, 3]
    expected = single_process(JOB)
    for result in results:
        assert max_param_diff(result["params"], expected) < tolerance
    for result in results[1:]:
        assert torch.equal(result["params"]["0.weight"], results[0]["params"]["0.weight"])
    assert results[0]["sent"] > 0
    if codec_name == "int8":  # not the identity: the codec's error is really there
        assert max_param_diff(results[0]["params"], expected) > 1e-9
