"""potluck.DataParallel against one process and against torch DDP, as real Gloo ranks.

Every rank function runs in its own process (potluck.testing.run_ranks) on the
default Gloo group; results come back to the test process and are compared there.
Models are float64 so that the only differences are summation order (tolerance 1e-9).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from potluck import DataParallel
from potluck.testing import run_ranks
from tests.distributed import models as M
from tests.distributed.models import assert_close, mse

# --------------------------------------------------------------- one backward, N ranks


def _one_backward(rank: int, world_size: int, cap_mb: float) -> dict[str, Any]:
    model = DataParallel(M.mlp(), bucket_cap_mb=cap_mb, first_bucket_cap_mb=cap_mb / 4)
    x, y = M.batch(0)
    mse(model(M.shard(x, rank, world_size)), M.shard(y, rank, world_size)).backward()
    in_buckets = all(
        any(p.grad.data_ptr() >= b.buffer.data_ptr()
            and p.grad.data_ptr() < b.buffer.data_ptr() + b.buffer.numel() * 8
            for b in model.buckets)
        for p in model.module.parameters()
    )
    return {"grads": M.grads(model.module), "in_buckets": in_buckets,
            "buckets": len(model.buckets)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("cap_mb", [0.004, 25.0])
def test_gradients_equal_single_process(world_size: int, cap_mb: float) -> None:
    reference = M.mlp()
    x, y = M.batch(0)
    mse(reference(x), y).backward()
    for result in run_ranks(_one_backward, world_size, cap_mb):
        assert_close(result["grads"], M.grads(reference))
        assert result["in_buckets"], "gradients must be views into the bucket buffers"
        assert result["buckets"] == (1 if cap_mb == 25.0 else 3)


# --------------------------------------------------------- 20 steps against torch DDP


def _train_twenty(rank: int, world_size: int, optimizer: str) -> dict[str, Any]:
    ours = DataParallel(M.mlp(seed=rank), bucket_cap_mb=0.004, first_bucket_cap_mb=0.001)
    theirs = TorchDDP(M.mlp(seed=rank), bucket_cap_mb=0.004)  # same rank-0 init after sync
    out = {}
    for name, model in (("potluck", ours), ("torch", theirs)):
        opt: torch.optim.Optimizer
        if optimizer == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
        for step in range(20):
            x, y = M.batch(step)
            opt.zero_grad()
            mse(model(M.shard(x, rank, world_size)), M.shard(y, rank, world_size)).backward()
            opt.step()
        out[name] = M.params(model.module)
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_twenty_steps_equal_torch_ddp(world_size: int, optimizer: str) -> None:
    results = run_ranks(_train_twenty, world_size, optimizer)
    for result in results:
        assert_close(result["potluck"], result["torch"])
        assert_close(result["potluck"], results[0]["potluck"])
    assert not torch.equal(results[0]["potluck"]["0.weight"], M.params(M.mlp())["0.weight"])


# ------------------------------------------------------------------------ no_sync


def _accumulate(rank: int, world_size: int) -> dict[str, Any]:
    model = DataParallel(M.mlp())
    x, y = M.batch(0, size=4 * M.GLOBAL_BATCH)
    xs, ys = M.shard(x, rank, world_size), M.shard(y, rank, world_size)
    micro = xs.shape[0] // 4
    for k in range(4):
        chunk = slice(k * micro, (k + 1) * micro)
        if k < 3:
            with model.no_sync():
                (mse(model(xs[chunk]), ys[chunk]) / 4).backward()
        else:
            (mse(model(xs[chunk]), ys[chunk]) / 4).backward()
    return M.grads(model.module)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 3])
def test_no_sync_accumulation_equals_four_times_larger_batch(world_size: int) -> None:
    reference = M.mlp()
    x, y = M.batch(0, size=4 * M.GLOBAL_BATCH)
    mse(reference(x), y).backward()
    for grads in run_ranks(_accumulate, world_size):
        assert_close(grads, M.grads(reference))


# -------------------------------------------------------------- unused parameters


def _branches(step: int, rank: int) -> str:
    """Steps 0, 3, 6..: every rank left; 1, 4..: rank 0 right, others left; else right."""
    if step % 3 == 0:
        return "left"
    if step % 3 == 1:
        return "right" if rank == 0 else "left"
    return "right"


def _sum_then_divide(state: Any, bucket: Any) -> torch.futures.Future[Any]:
    """A user hook that returns a new tensor (exercises copy-back and the lone bitmap)."""
    future = bucket.group.allreduce([bucket.buffer]).get_future()
    return future.then(lambda f: f.value()[0] / bucket.world_size)


def _train_branchy(rank: int, world_size: int, custom_hook: bool) -> dict[str, Any]:
    ours = DataParallel(M.branchy(), bucket_cap_mb=0.001, first_bucket_cap_mb=0.0005)
    if custom_hook:
        ours.register_comm_hook(None, _sum_then_divide)
    theirs = TorchDDP(M.branchy(), bucket_cap_mb=0.001, find_unused_parameters=True)
    out: dict[str, Any] = {}
    for name, model in (("potluck", ours), ("torch", theirs)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        grads_seen = []
        for step in range(9):
            x, y = M.batch(step)
            opt.zero_grad()
            out_ = model(M.shard(x, rank, world_size), _branches(step, rank))
            mse(out_, M.shard(y, rank, world_size)).backward()
            grads_seen.append(M.grads(model.module))
            opt.step()
        out[name] = {"params": M.params(model.module), "grads": grads_seen}
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("world_size", "custom_hook"), [(2, False), (3, False), (2, True)])
def test_data_dependent_branch_matches_torch_find_unused(world_size: int,
                                                         custom_hook: bool) -> None:
    for result in run_ranks(_train_branchy, world_size, custom_hook):
        assert_close(result["potluck"]["params"], result["torch"]["params"])
        for ours, theirs in zip(result["potluck"]["grads"], result["torch"]["grads"],
                                strict=True):
            assert_close(ours, theirs)
        first = result["potluck"]["grads"][0]
        assert first["right.weight"] is None  # no rank used it: None stays None
        assert first["never.weight"] is None
        assert result["potluck"]["grads"][1]["right.weight"] is not None  # rank 0 used it


# --------------------------------------------------------------------- BatchNorm


def _train_batchnorm(rank: int, world_size: int) -> dict[str, Any]:
    ours = DataParallel(M.batchnorm_net(seed=rank))
    theirs = TorchDDP(M.batchnorm_net(seed=rank))
    out: dict[str, Any] = {}
    for name, model in (("potluck", ours), ("torch", theirs)):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(10):
            x, y = M.batch(step)
            opt.zero_grad()
            mse(model(M.shard(x, rank, world_size)), M.shard(y, rank, world_size)).backward()
            opt.step()
        out[name] = {"params": M.params(model.module),
                     "buffers": {n: b.clone() for n, b in model.module.named_buffers()}}
    return out


@pytest.mark.timeout(60)
def test_batchnorm_buffers_equal_across_ranks_after_training() -> None:
    results = run_ranks(_train_batchnorm, 2)
    rank0 = results[0]["potluck"]
    assert rank0["buffers"]["1.num_batches_tracked"].item() == 10
    for result in results:
        assert_close(result["potluck"]["buffers"], rank0["buffers"])
        assert_close(result["potluck"]["params"], result["torch"]["params"])
    assert_close(rank0["buffers"], results[0]["torch"]["buffers"])  # rank 0's statistics


# ----------------------------------------------------------------- mismatched models


def _mismatch(rank: int, world_size: int) -> dict[str, Any]:
    import time

    from potluck.errors import ModelMismatchError

    torch.manual_seed(0)
    hidden = 32 if rank == 0 else 16
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, hidden), nn.Linear(hidden, 4))
    start = time.monotonic()
    try:
        DataParallel(model)
    except ModelMismatchError as exc:
        return {"message": str(exc), "seconds": time.monotonic() - start}
    return {"message": None, "seconds": time.monotonic() - start}


@pytest.mark.timeout(60)
def test_mismatched_models_raise_the_same_clear_error_on_every_rank() -> None:
    results = run_ranks(_mismatch, 3, timeout=30)
    messages = {r["message"] for r in results}
    assert len(messages) == 1, messages
    message = messages.pop()
    assert message is not None
    assert "'1.weight'" in message and "[32, 8]" in message and "[16, 8]" in message
    assert "rank 0" in message and "rank 1" in message
    assert all(r["seconds"] < 10 for r in results)


# ------------------------------------------------ weighted averaging, unequal shares


def _weighted(rank: int, world_size: int, sizes: list[int]) -> dict[str, Any]:
    from potluck import weighted_mean

    start = sum(sizes[:rank])
    local = sizes[rank]
    model = DataParallel(M.mlp(), comm_hook=weighted_mean, comm_state=local / sum(sizes))
    x, y = M.batch(0)
    mse(model(x[start : start + local]), y[start : start + local]).backward()
    return M.grads(model.module)


@pytest.mark.timeout(60)
def test_weighted_hook_with_unequal_shares_equals_global_batch_gradient() -> None:
    reference = M.mlp()
    x, y = M.batch(0)
    mse(reference(x), y).backward()
    for grads in run_ranks(_weighted, 3, [2, 7, 3]):
        assert_close(grads, M.grads(reference))


# ---------------------------------------------------- an explicit, swapped group


def _explicit_groups(rank: int, world_size: int) -> dict[str, Any]:
    from potluck import GroupHandle

    handle = GroupHandle(dist.new_group(list(range(world_size))), owned=False)
    model = DataParallel(M.mlp(), group=handle, bucket_cap_mb=0.004)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        if step == 2:  # a new membership generation: the handle the model holds moves on
            handle.reconfigure(dist.new_group(list(range(world_size))), generation=1)
        x, y = M.batch(step)
        opt.zero_grad()
        mse(model(M.shard(x, rank, world_size)), M.shard(y, rank, world_size)).backward()
        clipped = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
    return {"params": M.params(model.module), "norm": float(clipped)}


def _single_process_clipped() -> dict[str, torch.Tensor]:
    model = M.mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        x, y = M.batch(step)
        opt.zero_grad()
        mse(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
    return M.params(model)


@pytest.mark.timeout(60)
def test_the_handle_moves_to_a_new_group_between_steps_and_clipping_after_backward() -> None:
    expected = _single_process_clipped()
    results = run_ranks(_explicit_groups, 2)
    for result in results:
        assert_close(result["params"], expected)
    assert results[0]["norm"] == pytest.approx(results[1]["norm"], rel=1e-12)


# ----------------------------------------------------------------- world size 1


def test_world_size_one_without_any_process_group() -> None:
    assert not dist.is_initialized()
    model = DataParallel(M.mlp())
    assert model.world_size == 1 and model.rank == 0
    reference = M.mlp()
    x, y = M.batch(0)
    mse(model(x), y).backward()
    mse(reference(x), y).backward()
    assert_close(M.grads(model.module), M.grads(reference))
    with model.no_sync():
        mse(model(x), y).backward()
    torch.testing.assert_close(model.module[0].weight.grad, 2 * reference[0].weight.grad)


def test_unknown_argument_is_a_clear_error() -> None:
    from potluck.errors import ConfigError

    with pytest.raises(ConfigError, match="bucket_cap"):
        DataParallel(M.mlp(), bucket_size=3)
    with pytest.raises(ConfigError, match="positive"):
        DataParallel(M.mlp(), bucket_cap_mb=0)


# ------------------------------------------------------------ a peer leaves mid-run


SHAPES = "The size of tensor a (10) must match the size of tensor b (20)"


def _mean_then_check(state: Any, bucket: Any) -> torch.futures.Future[Any]:
    """potluck's mean, with a callback of the hook's own after it (a lost peer fails the
    all-reduce's future, and the callback quotes that error)."""
    from potluck import allreduce_mean

    return allreduce_mean(state, bucket).then(lambda fut: fut.value())


def _peer_leaves(rank: int, world_size: int, hooked: bool = False) -> dict[str, Any]:
    import time

    from potluck.errors import CommunicationError

    model = DataParallel(M.mlp())
    if hooked:
        model.register_comm_hook(None, _mean_then_check)
    x, y = M.batch(0)
    mse(model(M.shard(x, rank, world_size)), M.shard(y, rank, world_size)).backward()
    if rank == 1:  # returns: its process tears down the group and closes its sockets
        return {"error": None, "seconds": 0.0}
    start = time.monotonic()
    try:
        mse(model(M.shard(x, rank, world_size)), M.shard(y, rank, world_size)).backward()
    except CommunicationError as exc:
        return {"error": str(exc), "seconds": time.monotonic() - start}
    return {"error": None, "seconds": time.monotonic() - start}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hooked", [False, True])
def test_vanished_peer_is_a_typed_error_from_backward_not_a_hang(hooked: bool) -> None:
    survivor = run_ranks(_peer_leaves, 2, hooked, timeout=45, collective_timeout=20)[0]
    assert survivor["error"] is not None and "bucket" in survivor["error"]
    assert "a peer died" in survivor["error"], survivor["error"]  # the backend's failure
    assert survivor["seconds"] < 15


def _raise_in_hook(state: Any, bucket: Any) -> torch.futures.Future[Any]:
    raise RuntimeError(SHAPES)


def _raise_in_callback(state: Any, bucket: Any) -> torch.futures.Future[Any]:
    from potluck import allreduce_mean

    def check(fut: torch.futures.Future[Any]) -> Any:
        raise RuntimeError(SHAPES)

    return allreduce_mean(state, bucket).then(check)


def _torch_style_raising(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[Any]:
    """A torch DDP hook (chained a bucket at a time) whose callback fails."""
    def check(fut: torch.futures.Future[Any]) -> Any:
        raise RuntimeError(SHAPES)

    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(check)


def _buggy_hook(rank: int, world_size: int, in_callback: bool | str) -> str:
    from potluck.errors import CommHookError

    if in_callback == "torch":  # several buckets: a chain waits for the one before
        model = DataParallel(M.mlp(), bucket_cap_mb=0.004, first_bucket_cap_mb=0.001)
        model.register_comm_hook(None, _torch_style_raising)
    else:
        model = DataParallel(M.mlp())
        model.register_comm_hook(None, _raise_in_callback if in_callback else _raise_in_hook)
    x, y = M.batch(0)
    try:
        mse(model(M.shard(x, rank, world_size)), M.shard(y, rank, world_size)).backward()
    except CommHookError as exc:
        assert isinstance(exc.__cause__, RuntimeError)  # the hook's own, with its traceback
        return str(exc)
    return "no error"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("in_callback", [False, True, "torch"])
def test_a_hooks_own_error_is_its_own_not_a_lost_peer(in_callback: bool | str) -> None:
    """Redoing the step would fail the same way: an elastic cohort must not take it for
    a lost peer (it used to redo the step until the cursor refused)."""
    for rank, message in enumerate(run_ranks(_buggy_hook, 2, in_callback, timeout=45)):
        assert ("_raise_in_" in message or "_torch_style_raising" in message) \
            and SHAPES in message, message
        assert f"on rank {rank}" in message and "not a lost peer" in message


# ------------------------------------------------- overlap with the backward pass


def _launch_log(rank: int, world_size: int) -> list[tuple[int, bool]]:
    from potluck import allreduce_mean

    model = DataParallel(M.mlp(), bucket_cap_mb=0.004, first_bucket_cap_mb=0.001)
    first_layer = model.module[0].weight
    launches: list[tuple[int, bool]] = []

    def recording_hook(state: Any, bucket: Any) -> torch.futures.Future[Any]:
        launches.append((bucket.index, first_layer.grad is None))
        return allreduce_mean(state, bucket)

    model.register_comm_hook(None, recording_hook)
    x, y = M.batch(0)
    for _ in range(2):  # the second pass runs on the rebuilt buckets
        launches.clear()
        model.zero_grad()
        mse(model(M.shard(x, rank, world_size)), M.shard(y, rank, world_size)).backward()
    return launches


@pytest.mark.timeout(60)
def test_buckets_launch_in_order_while_backward_is_still_running() -> None:
    for launches in run_ranks(_launch_log, 2):
        assert [index for index, _ in launches] == list(range(len(launches)))
        assert len(launches) >= 3
        assert launches[0][1], "the first bucket must go out before the first layer's grad"
        assert not launches[-1][1]


def _peer_leaves_abandon(rank: int, world_size: int) -> dict[str, Any]:
    model = DataParallel(M.mlp(), on_failure="abandon")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = M.batch(0)
    results = []
    for step in range(2):
        if step == 1 and rank == 1:  # leaves: its process closes its sockets
            return {}
        before = M.params(model.module)
        opt.zero_grad()
        mse(model(M.shard(x, rank, world_size)), M.shard(y, rank, world_size)).backward()
        # backward returned normally even when the step failed; the step transaction
        # (potluck.prepare) is what skips it, as here
        if not model.step_failed:
            opt.step()
        results.append({"step_failed": model.step_failed,
                        "grads": M.grads(model.module),
                        "unchanged": all(torch.equal(before[k], v)
                                         for k, v in M.params(model.module).items())})
    return {"results": results}


@pytest.mark.timeout(60)
def test_abandon_mode_drops_the_failed_step_and_returns_from_backward() -> None:
    survivor = run_ranks(_peer_leaves_abandon, 2, timeout=45, collective_timeout=20)[0]
    first, second = survivor["results"]
    assert not first["step_failed"] and not first["unchanged"]
    assert second["step_failed"]
    assert all(g is None for g in second["grads"].values())  # half-reduced: dropped
    assert second["unchanged"]  # the failed step was not applied


def test_on_failure_must_be_raise_or_abandon() -> None:
    from potluck.errors import ConfigError

    with pytest.raises(ConfigError, match="abandon"):
        DataParallel(M.mlp(), on_failure="ignore")


# ------------------------------------------------------- the start's broadcast, skipped


def _start(rank: int, world_size: int, differ: str) -> dict[str, Any]:
    from potluck.reducer import data_parallel

    sent: list[int] = []
    real = data_parallel.broadcast_coalesced

    def counting(tensors: Any, group: Any, src: int = 0) -> None:
        sent.append(len(tensors))
        real(tensors, group, src=src)

    data_parallel.broadcast_coalesced = counting  # type: ignore[assignment]
    net = M.batchnorm_net(seed=rank if differ == "parameters" else 0)
    if differ == "buffers" and rank == 1:
        for module in net.modules():
            if isinstance(module, nn.BatchNorm1d):
                module.running_mean.add_(1.0)  # type: ignore[operator]
    model = DataParallel(net)
    state = {**M.params(model.module),
             **{n: b.clone() for n, b in model.module.named_buffers()}}
    return {"sent": sent, "state": state}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("differ", ["nothing", "parameters", "buffers"])
def test_replicas_that_start_equal_skip_the_start_broadcast(differ: str) -> None:
    """Rank 0's parameters and buffers are broadcast at the start only when some rank
    holds other values (over a slow link a model's worth of bytes saved); either way
    every replica starts as rank 0's."""
    results = run_ranks(_start, 2, differ)
    assert [len(r["sent"]) for r in results] == ([0, 0] if differ == "nothing" else [1, 1])
    for name, value in results[0]["state"].items():
        assert torch.equal(results[1]["state"][name], value), name
    if differ == "parameters":  # rank 1 built other values and took rank 0's
        assert not torch.equal(M.params(M.batchnorm_net(seed=1))["0.weight"],
                               results[1]["state"]["0.weight"])


def _checked(rank: int, world_size: int, kind: str) -> bool:
    from potluck.collectives import default_group
    from potluck.reducer.consistency import same_values

    values = torch.arange(6.0).reshape(2, 3)
    if kind == "conjugate":  # numpy cannot read a lazily conjugated view: hashed resolved
        tensors = [torch.complex(values, values).conj()]
    elif kind == "quantized on one rank":  # its bytes are not all of its value
        tensors = [torch.quantize_per_tensor(values, 0.1, 0, torch.qint8) if rank == 1
                   else values]
    else:
        tensors = [values.t()]  # not contiguous
    group = default_group()
    assert group is not None
    return same_values(tensors, group, torch.device("cpu"))


@pytest.mark.timeout(60)
def test_same_values_answers_alike_on_every_rank() -> None:
    """Whatever one rank cannot hash, every rank takes part in the one gather and
    gets the same answer (no rank left waiting in a collective)."""
    assert run_ranks(_checked, 2, "conjugate") == [True, True]
    assert run_ranks(_checked, 2, "not contiguous") == [True, True]
    assert run_ranks(_checked, 2, "quantized on one rank") == [False, False]
