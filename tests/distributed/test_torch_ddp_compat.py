"""torch DDP's own pieces on potluck.DataParallel, against torch DDP, as real Gloo ranks.

torch's communication hooks (allreduce, fp16, bf16, PowerSGD), the
``require_backward_grad_sync`` switch, and torch's ``Join`` with uneven inputs. Models are
float32 and both sides do the same arithmetic on the same buckets, so results are
compared bit for bit.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms import Join
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    powerSGD_hook,
)
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from potluck import DataParallel
from potluck.testing import run_ranks
from tests.distributed import models as M

HOOKS = ("allreduce", "fp16", "bf16", "powersgd")
STEPS = 5


def _bf16_twin(state, bucket):
    """torch DDP refuses bf16_compress_hook by its name unless NCCL is there; Gloo reduces
    bf16 fine, so torch's side runs the same function under another name. (Unannotated:
    torch DDP checks annotations against the classes, and this module's are strings.)"""
    return default_hooks.bf16_compress_hook(state, bucket)


def _hook(name: str, side: str) -> tuple[Any, Any]:
    if name == "powersgd":  # compresses from the third step on (after the rebuild)
        return PowerSGDState(process_group=None, matrix_approximation_rank=1,
                             start_powerSGD_iter=2), powerSGD_hook
    if name == "bf16" and side == "torch":
        return None, _bf16_twin
    return None, {"allreduce": default_hooks.allreduce_hook,
                  "fp16": default_hooks.fp16_compress_hook,
                  "bf16": default_hooks.bf16_compress_hook}[name]


def _float_batch(step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = M.batch(step)
    return M.shard(x, rank, world_size).float(), M.shard(y, rank, world_size).float()


def _train(model: torch.nn.Module, rank: int, world_size: int) -> dict[str, Any]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for step in range(STEPS):
        x, y = _float_batch(step, rank, world_size)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        grads.append(M.grads(model.module))
        opt.step()
    return {"grads": grads, "params": M.params(model.module)}


def _ddp_style_unannotated(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    return default_hooks.allreduce_hook(state, bucket)  # calls bucket.buffer()


def _with_torch_hooks(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {"plain": _train(DataParallel(M.mlp(dtype=torch.float32)),
                                           rank, world_size)}
    for name in HOOKS:
        for side, wrap in (("potluck", DataParallel), ("torch", TorchDDP)):
            model = wrap(M.mlp(dtype=torch.float32))
            model.register_comm_hook(*_hook(name, side))
            out[f"{name}/{side}"] = _train(model, rank, world_size)
    # several buckets: PowerSGD issues collectives from its callbacks (torch DDP on Gloo
    # hangs here, so there is no torch side)
    several = DataParallel(M.mlp(dtype=torch.float32), bucket_cap_mb=0.004,
                           first_bucket_cap_mb=0.004)
    several.register_comm_hook(*_hook("powersgd", "potluck"))
    out["powersgd/buckets"] = _train(several, rank, world_size) | {
        "count": len(several.buckets)}
    # a torch-style hook that does not say so gets a potluck Bucket: a clear error
    unannotated = DataParallel(M.mlp(dtype=torch.float32))
    unannotated.register_comm_hook(None, _ddp_style_unannotated)
    try:
        _train(unannotated, rank, world_size)
        out["unannotated"] = None
    except Exception as exc:
        out["unannotated"] = f"{type(exc).__name__}: {exc}"
    return out


@pytest.fixture(scope="module")
def hook_runs() -> list[dict[str, Any]]:
    return run_ranks(_with_torch_hooks, 2, timeout=80)


def _equal(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    return ours.keys() == theirs.keys() and all(
        torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", HOOKS)
def test_torch_hook_gives_exactly_what_torch_ddp_gives(hook_runs: list[dict[str, Any]],
                                                      name: str) -> None:
    for result in hook_runs:
        ours, theirs = result[f"{name}/potluck"], result[f"{name}/torch"]
        for step in range(STEPS):
            assert _equal(ours["grads"][step], theirs["grads"][step]), f"step {step}"
        assert _equal(ours["params"], theirs["params"])
        assert _equal(ours["params"], hook_runs[0][f"{name}/potluck"]["params"])
        # the hook really ran: compression changes the average, allreduce does not
        compressed = not _equal(ours["params"], result["plain"]["params"])
        assert compressed == (name != "allreduce")


@pytest.mark.timeout(90)
def test_powersgd_over_several_buckets_keeps_the_ranks_in_step(
        hook_runs: list[dict[str, Any]]) -> None:
    first, second = (r["powersgd/buckets"] for r in hook_runs)
    assert first["count"] >= 2
    assert _equal(first["params"], second["params"])
    assert not _equal(first["params"], hook_runs[0]["plain"]["params"])


@pytest.mark.timeout(90)
def test_an_unannotated_torch_style_hook_is_a_clear_error(
        hook_runs: list[dict[str, Any]]) -> None:
    for result in hook_runs:
        message = result["unannotated"]
        assert message is not None and message.startswith("ConfigError")
        assert "bucket.buffer()" in message and "torch.distributed.GradBucket" in message


# ------------------------------------------------------ require_backward_grad_sync


def _local_then_synced(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    x, y = _float_batch(0, rank, world_size)
    for side, wrap in (("potluck", DataParallel), ("torch", TorchDDP)):
        model = wrap(M.mlp(dtype=torch.float32))
        model.require_backward_grad_sync = False  # nanoGPT's accumulation switch
        ((model(x) - y) ** 2).mean().backward()
        attribute = M.grads(model.module)
        model.require_backward_grad_sync = True
        model.zero_grad()
        with model.no_sync():  # the forward decides, not the backward
            output = model(x)
        ((output - y) ** 2).mean().backward()
        forward_inside = M.grads(model.module)
        ((model(x) - y) ** 2).mean().backward()  # synchronized: averages the sum
        out[side] = {"attribute": attribute, "forward_inside": forward_inside,
                     "synced": M.grads(model.module)}
    return out


@pytest.mark.timeout(60)
def test_require_backward_grad_sync_false_keeps_gradients_local_as_in_torch() -> None:
    results = run_ranks(_local_then_synced, 2)
    for result in results:
        ours, theirs = result["potluck"], result["torch"]
        for phase in ("attribute", "forward_inside", "synced"):
            assert _equal(ours[phase], theirs[phase]), phase
    local = [r["potluck"]["attribute"]["0.weight"] for r in results]
    assert not torch.equal(local[0], local[1])  # each rank kept its own gradient
    synced = [r["potluck"]["synced"]["0.weight"] for r in results]
    assert torch.equal(synced[0], synced[1])


# -------------------------------------------------------------- Join, uneven inputs


def _uneven(rank: int, world_size: int) -> dict[str, Any]:
    batches = 3 if rank == 0 else 6  # rank 0 (the buffer source otherwise) leaves first
    out: dict[str, Any] = {"groups": []}
    for name in ("mean", "powersgd"):
        for side, wrap in (("potluck", DataParallel), ("torch", TorchDDP)):
            model = wrap(M.batchnorm_net().float())
            if name == "powersgd":
                model.register_comm_hook(*_hook(name, side))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            with Join([model]):
                for step in range(batches):
                    x, y = M.batch(step * world_size + rank, size=6)
                    opt.zero_grad()
                    ((model(x.float()) - y.float()) ** 2).mean().backward()
                    opt.step()
            module = model.module
            out["groups"].append(model.process_group is dist.group.WORLD)
            out[f"{name}/{side}"] = M.params(module) | {
                n: b.clone() for n, b in module.named_buffers()}
    model = DataParallel(M.batchnorm_net().float())
    try:  # last: after the throw, no collective of the two ranks is left unmatched
        with Join([model], throw_on_early_termination=True):
            for _ in range(batches):
                model(M.batch(rank, size=6)[0].float()).sum().backward()
        out["thrown"] = None
    except RuntimeError as exc:
        out["thrown"] = str(exc)
    return out


@pytest.mark.timeout(60)
def test_join_with_uneven_inputs_matches_torch_ddp() -> None:
    results = run_ranks(_uneven, 2)
    for result in results:
        assert result["groups"] == [True] * 4  # model.process_group: the default group
        for name in ("mean", "powersgd"):
            ours = result[f"{name}/potluck"]
            assert _equal(ours, result[f"{name}/torch"]), name
            assert _equal(ours, results[0][f"{name}/potluck"]), name
        assert result["mean/potluck"]["1.num_batches_tracked"].item() == 6
    assert "Rank 0 exhausted all inputs" in results[0]["thrown"]
    assert "Throwing across all ranks" in results[1]["thrown"]
