"""Accumulation, clipping, bf16 and non-finite skipping across real Gloo ranks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from potluck import DataParallel
from potluck.errors import ConfigError
from potluck.step import GuardedOptimizer, accumulate, split_batch
from potluck.testing import join, run_ranks
from tests.distributed import models as M
from tests.distributed.models import assert_close, mse

# ---------------------------------------------------------------------------- units


def test_split_batch_weights_sum_to_one_and_cover_the_batch() -> None:
    x = torch.arange(10).float()
    chunks = split_batch((x, x * 2), 3)
    assert [len(c[0]) for c, _ in chunks] == [3, 3, 4]
    assert sum(w for _, w in chunks) == pytest.approx(1.0)
    assert torch.equal(torch.cat([c[0] for c, _ in chunks]), x)
    assert len(split_batch(x, 50)) == 10  # never an empty micro-batch


def test_split_batch_splits_lists_of_samples_with_their_fields() -> None:
    """A list of strings, of samples or of variable-length sequences is one entry per
    sample: it used to be kept whole (strings) or have every sequence cut along its
    own length (each micro-batch got every sequence, half of each)."""
    x = torch.arange(4.0).view(4, 1)
    chunks = split_batch({"x": x, "names": ["a", "b", "c", "d"], "flag": True}, 2)
    assert [c["names"] for c, _ in chunks] == [["a", "b"], ["c", "d"]]
    assert [c["flag"] for c, _ in chunks] == [True, True]
    seqs = [torch.full((n,), float(i)) for i, n in enumerate([3, 1, 2, 4])]
    chunks = split_batch((seqs, torch.arange(4)), 2)
    assert [[s.tolist() for s in c[0]] for c, _ in chunks] == [
        [[0.0] * 3, [1.0]], [[2.0] * 2, [3.0] * 4]]
    assert [c[1].tolist() for c, _ in chunks] == [[0, 1], [2, 3]]
    kept = split_batch([(x[i], i) for i in range(3)], 2)  # a collate that keeps samples
    assert [[i for _, i in c] for c, _ in kept] == [[0], [1, 2]]
    fields = split_batch([x, x * 2], 2)  # torch's default_collate of (x, y) samples
    assert torch.equal(fields[1][0][1], x[2:] * 2)
    # sequences of one length: one per sample, as the labels beside them say
    chunks = split_batch(([torch.ones(3)] * 4, torch.arange(4)), 2)
    assert [len(c[0]) for c, _ in chunks] == [2, 2]
    assert [len(c[0][0]) for c, _ in chunks] == [3, 3]
    # strings as torch's default_collate gives them: a tuple
    chunks = split_batch({"x": x, "names": ("a", "b", "c", "d")}, 2)
    assert [c["names"] for c, _ in chunks] == [("a", "b"), ("c", "d")]
    with pytest.raises(ConfigError, match=r"list of 3 tensors whose first dimensions"):
        split_batch(([torch.ones(2)] * 3, torch.arange(4)), 2)  # neither per sample nor fields


def test_split_batch_rejects_bad_input() -> None:
    with pytest.raises(ConfigError, match="micro_batches"):
        split_batch(torch.zeros(4), 0)
    with pytest.raises(ConfigError, match="one number of samples in every field"):
        split_batch((torch.zeros(4), torch.zeros(5)), 2)


def test_guarded_optimizer_rejects_bad_clip() -> None:
    with pytest.raises(ConfigError, match="clip_grad_norm"):
        GuardedOptimizer(torch.optim.SGD(M.mlp().parameters(), lr=0.1), clip_grad_norm=-1)


# ----------------------------------------------- per-rank micro-batch counts


def _accumulate_uneven(rank: int, world_size: int) -> dict[str, Any]:
    model = DataParallel(M.mlp())
    x, y = M.batch(0, size=4 * M.GLOBAL_BATCH)
    micro = [4, 1, 3][rank]  # each rank chooses its own number of micro-batches
    for (cx, cy), weight in accumulate(model, (M.shard(x, rank, world_size),
                                               M.shard(y, rank, world_size)), micro):
        (mse(model(cx), cy) * weight).backward()
    return M.grads(model.module)


@pytest.mark.timeout(60)
def test_accumulation_with_per_rank_micro_batches_equals_one_big_batch() -> None:
    reference = M.mlp()
    x, y = M.batch(0, size=4 * M.GLOBAL_BATCH)
    mse(reference(x), y).backward()
    for grads in run_ranks(_accumulate_uneven, 3):
        assert_close(grads, M.grads(reference))


# ------------------------------------------------------------------- clipping


def _clipped(rank: int, world_size: int) -> dict[str, Any]:
    model = DataParallel(M.mlp())
    opt = GuardedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                           clip_grad_norm=0.05)
    norms = []
    for step in range(6):
        x, y = M.batch(step)
        opt.zero_grad()
        mse(model(M.shard(x, rank, world_size)), M.shard(y, rank, world_size)).backward()
        norms.append(opt.step().grad_norm)
    return {"params": M.params(model.module), "norms": norms}


@pytest.mark.timeout(60)
def test_clipping_after_averaging_equals_single_process_clipping() -> None:
    model = M.mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    norms = []
    for step in range(6):
        x, y = M.batch(step)
        opt.zero_grad()
        mse(model(x), y).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)))
        opt.step()
    assert max(norms) > 0.05  # clipping really happened
    for result in run_ranks(_clipped, 3):
        assert_close(result["params"], M.params(model))
        assert result["norms"] == pytest.approx(norms, rel=1e-9)


# ------------------------------------------------------------------------ bf16


def _bf16(rank: int, world_size: int) -> dict[str, Any]:
    model = DataParallel(M.mlp(dtype=torch.float32))
    opt = GuardedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01))
    x, y = M.batch(0)
    x, y = M.shard(x, rank, world_size).float(), M.shard(y, rank, world_size).float()
    losses = []
    for _ in range(15):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        assert out.dtype == torch.bfloat16
        loss = mse(out.float(), y)
        loss.backward()
        assert opt.step().committed
        losses.append(loss.item())
    return {"losses": losses, "params": M.params(model.module)}


@pytest.mark.timeout(60)
def test_bf16_autocast_trains_end_to_end() -> None:
    results = run_ranks(_bf16, 2)
    for result in results:
        assert result["losses"][-1] < 0.7 * result["losses"][0]
        assert_close(result["params"], results[0]["params"])


# ----------------------------------------------------------- non-finite gradients


def _nan_on_one_rank(rank: int, world_size: int, scaled: bool) -> dict[str, Any]:
    model = DataParallel(M.mlp(dtype=torch.float32))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if scaled else None
    opt = GuardedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), scaler=scaler)
    committed, snapshots, scales = [], [], []
    for step in range(6):
        x, y = M.batch(step)
        x, y = M.shard(x, rank, world_size).float(), M.shard(y, rank, world_size).float()
        opt.zero_grad()
        loss = mse(model(x), y)
        if step == 3 and rank == 1:
            loss = loss * float("nan" if not scaled else "inf")
        (scaler.scale(loss) if scaler is not None else loss).backward()
        committed.append(opt.step().committed)
        snapshots.append(M.params(model.module))
        scales.append(scaler.get_scale() if scaler is not None else 1.0)
    return {"committed": committed, "snapshots": snapshots, "skipped": opt.skipped,
            "scales": scales}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "grad-scaler"])
def test_nan_on_one_rank_makes_every_rank_skip_that_step(scaled: bool) -> None:
    results = run_ranks(_nan_on_one_rank, 3, scaled)
    for result in results:
        assert result["committed"] == [True, True, True, False, True, True]
        assert result["skipped"] == 1
        assert_close(result["snapshots"][3], result["snapshots"][2])  # no update at step 3
        assert not torch.equal(result["snapshots"][5]["0.weight"],
                               result["snapshots"][3]["0.weight"])  # training went on
        assert all(torch.isfinite(p).all() for p in result["snapshots"][5].values())
        assert_close(result["snapshots"][5], results[0]["snapshots"][5])
        assert result["scales"] == results[0]["scales"]
    if scaled:
        assert results[0]["scales"][3] == results[0]["scales"][2] / 2  # backed off


def _prepared_nan(rank: int, world_size: int, port: int, hook: str) -> dict[str, Any]:
    """``prepare``'s loop with rank 1's loss NaN at step 2; counts finiteness votes."""
    from unittest import mock

    import potluck
    from potluck.step import guard

    cohort = join(rank, world_size, port, timeout=20.0)
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    data = torch.utils.data.TensorDataset(torch.randn(40, 4), torch.randn(40, 2))
    extra: dict[str, Any] = {}
    if hook == "custom":  # not one of the reducer's built-in hooks: the ranks vote
        extra["comm_hook"] = lambda state, bucket: potluck.allreduce_mean(state, bucket)
    elif hook == "balance":
        extra["balance"] = True
    model, opt, loader = potluck.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1),
                                         data, global_batch=8, cohort=cohort, **extra)
    votes = 0
    vote = guard.allreduce_max

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal votes
        votes += 1
        return vote(*args, **kwargs)

    committed = []
    with mock.patch.object(guard, "allreduce_max", counted):
        for step, (x, y) in enumerate(loader):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            (loss * float("nan") if (step, rank) == (2, 1) else loss).backward()
            committed.append(opt.step().committed)
    opt.finish()
    return {"committed": committed, "votes": votes, "params": M.params(net)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hook", ["built-in", "balance", "custom"])
def test_prepare_votes_on_finiteness_only_under_a_custom_hook(hook: str) -> None:
    """The built-in hooks' all-reduce gives every rank the same bits, so each rank skips
    a NaN step alike without a vote (one round trip less per step); a custom hook's
    result need not be the same everywhere, so its ranks vote."""
    from potluck.testing import free_port

    results = run_ranks(_prepared_nan, 2, free_port(), hook, init_group=False, timeout=50)
    for result in results:
        assert result["committed"] == [True, True, False, True, True]
        assert result["votes"] == (5 if hook == "custom" else 0)
        assert_close(result["params"], results[0]["params"])
        assert all(torch.isfinite(p).all() for p in result["params"].values())
