"""What potluck.prepare refuses before it trains a step (one process: the pure checks)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import potluck
from potluck.errors import ConfigError
from potluck.prepare_checks import check_directory, check_split, whole_number

DATA = TensorDataset(torch.randn(16, 4), torch.randn(16, 2))


class _Stream(torch.utils.data.IterableDataset[int]):
    """An iterable dataset with a length: it has __getitem__ (Dataset's, which raises)."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(3))

    def __len__(self) -> int:
        return 3


def _prepare(net: torch.nn.Module | None = None, **kwargs: object) -> object:
    net = net or torch.nn.Linear(4, 2)
    opt = kwargs.pop("optimizer", None) or torch.optim.SGD(net.parameters(), lr=0.1)
    return potluck.prepare(net, opt, kwargs.pop("dataset", DATA),
                           global_batch=kwargs.pop("global_batch", 8), **kwargs)


def test_an_optimizer_over_another_model_is_refused() -> None:
    other = torch.nn.Linear(4, 2)
    with pytest.raises(ConfigError, match="none of them the model's"):
        _prepare(optimizer=torch.optim.SGD(other.parameters(), lr=0.1))
    net, extra = torch.nn.Linear(4, 2), torch.nn.Parameter(torch.ones(3))
    with pytest.raises(ConfigError, match=r"1 parameter\(s\) that are not the model's.*\(3,\)"):
        _prepare(net, optimizer=torch.optim.SGD([*net.parameters(), extra], lr=0.1))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"dataset": None}, "map-style dataset"),
    ({"dataset": iter(range(3))}, "map-style dataset"),
    ({"clip_grad_norm": "1"}, "clip_grad_norm='1' must be a positive number"),
    ({"shares": "equal"}, "shares='equal' must be a share policy"),
    ({"minimum": 2}, r"minimum=2 must be a potluck.MinimumSize.*MinimumSize\(2, 60\)"),
    ({"collate": 3}, "collate=3 must be a function"),
    ({"seed": 1.5}, "seed=1.5 must be an int"),
    ({"global_batch": True}, "global_batch=True must be an int"),
    ({"global_batch": 20}, r"the dataset has 16 samples, fewer than global_batch=20: every "
                           r"step would train on 16 samples, not 20; pass global_batch=16 or "
                           r"less, or a larger dataset"),
    ({"global_batch": 20, "drop_last": True}, "fewer than global_batch=20"),
    ({"dataset": _Stream()}, r"dataset\[i\]\), got _Stream"),  # (it has a __len__)
    ({"bucket_cap_mb": "25"}, "bucket_cap_mb='25' must be a positive, finite number"),
    ({"bucket_cap_mb": float("nan")}, "bucket_cap_mb=nan must be a positive, finite"),
    ({"first_bucket_cap_mb": None}, "first_bucket_cap_mb=None must be a positive"),
    ({"timeout": "60"}, "timeout='60' must be a positive number of seconds"),
    ({"cohort": "x"}, "cohort='x' must be a potluck.Cohort"),
    ({"checkpoint_dir": 5}, "checkpoint_dir=5 must be a path"),
    ({"resume": "yes"}, "resume='yes' must be True or False"),
    ({"broadcast_buffers": "no"}, r"DataParallel\(broadcast_buffers='no'\): pass True or"),
    ({"device_ids": [0]}, r"device_ids=\[0\] names an accelerator, but the module's "
                          "parameters are on the CPU"),
    ({"device_ids": "cuda"}, "device_ids='cuda' must be a list of one device"),
    ({"collate_fn": list, "prefetch_factor": 2}, r"DataLoader option\(s\) \['collate_fn', "
                                             r"'prefetch_factor'\].*collate_fn: pass collate=.*"
                                             r"prefetch_factor: pass prefetch="),
    ({"num_workers": -1}, r"num_workers=-1 must be an int >= 0"),
    ({"num_workers": True}, r"num_workers=True must be an int >= 0"),
    ({"num_workers": 2, "prefetch": 0}, r"prefetch=0 must be an int >= 1"),
    ({"num_workers": 2, "read_timeout": "1m"}, r"read_timeout='1m' must be a positive number"),
    ({"read_timeout": 30}, r"read_timeout=30 with num_workers=0: a read in the training"),
])
def test_bad_arguments_are_named_not_a_traceback(kwargs: dict[str, object],
                                                 message: str | None) -> None:
    if message is None:
        _prepare(**kwargs)
        return
    with pytest.raises(ConfigError, match=message):
        _prepare(**kwargs)


def test_a_numpy_integer_is_a_whole_number() -> None:
    assert whole_number("global_batch", np.int64(8), "8") == 8
    _, opt, _ = _prepare(global_batch=np.int64(8), seed=np.int64(3))  # type: ignore[misc]
    opt.finish()
    assert potluck.MinimumSize(np.int64(2), 60).workers == 2


def test_drop_last_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="drop_last='no' must be True or False"):
        _prepare(drop_last="no")


def test_metrics_dir_must_be_a_directory(tmp_path: Path) -> None:
    afile = tmp_path / "f"
    afile.write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        _prepare(metrics_dir=afile)
    with pytest.raises(ConfigError, match="cannot be made"):
        check_directory("metrics_dir", afile / "sub")
    with pytest.raises(ConfigError, match=r"checkpoint_dir=.*cannot be made"):
        _prepare(checkpoint_dir=afile / "ck")  # found at setup, not at the minimum's stop
    check_directory("metrics_dir", tmp_path / "new" / "dir")  # made later: fine


@pytest.mark.parametrize(("length", "batch", "world", "drop_last", "steps", "message"), [
    (25, 8, 2, False, 1, "end each epoch with a step of 1 sample"),
    (25, 8, 2, True, 1, None),  # that step is left out
    (26, 8, 2, False, 1, None),  # a last step of 2: one each
    (16, 1, 2, False, 1, "global_batch=1 is smaller than the 2 workers"),
    (24, 8, 3, False, 1, None),
    (41, 4, 2, False, 5, "end each epoch with a round of 1 sample"),  # DiLoCo: rounds of 20
    (10, 64, 2, False, 1, "fewer than global_batch=64: every step would train on 10"),
    (30, 8, 2, False, 5, None),  # DiLoCo: one short round of 30 samples an epoch
])
def test_every_step_gives_every_worker_a_sample(length: int, batch: int, world: int,
                                                drop_last: bool, steps: int,
                                                message: str | None) -> None:
    if message is None:
        check_split(length, batch, world, drop_last, steps)
        return
    with pytest.raises(ConfigError, match=message) as caught:
        check_split(length, batch, world, drop_last, steps)
    assert any(fix in str(caught.value) for fix in ("drop_last=True", "at least", "or less"))


def test_a_module_wrapped_twice_is_refused() -> None:
    """Each wrapper would average again: gradients divided by the world size twice."""
    once = potluck.DataParallel(torch.nn.Linear(4, 2))
    with pytest.raises(ConfigError, match="already wrapped in DataParallel"):
        potluck.DataParallel(once)


@pytest.mark.parametrize("args", [("2", 60), (2.5, 60), (True, 60), (2, "60")])
def test_a_minimum_size_of_the_wrong_type_is_named(args: tuple[object, object]) -> None:
    with pytest.raises(ConfigError, match="workers must be an int >= 1"):
        potluck.MinimumSize(*args)  # type: ignore[arg-type]


def test_resume_from_a_missing_directory_says_so(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    _, opt, _ = _prepare(checkpoint_dir=tmp_path / "typo", resume=True)
    assert opt.steps == 0  # type: ignore[attr-defined]
    opt.finish()  # type: ignore[attr-defined]
    assert "no checkpoint in" in caplog.text and "starting from step 0" in caplog.text
    assert "no such directory" in caplog.text
    assert not (tmp_path / "typo").exists()  # a typo is not made a directory


def _saved(directory: Path) -> None:
    """A live state as prepare's jobs save it: the returned optimizer's state_dict."""
    _, opt, _ = _prepare()
    potluck.CheckpointManager(directory).save(3, opt.state_dict())  # type: ignore[attr-defined]
    opt.finish()  # type: ignore[attr-defined]


@pytest.mark.parametrize(("other", "message"), [
    ({"optimizer": "adamw"}, r"saved by another optimizer than this AdamW: its param "
                             r"group 0 lacks \['betas', 'eps'\]"),
    ({"net": "wider"}, "holds another model than this one: Error"),
    ({"file": "not live"}, r"is not a live state potluck.prepare wrote \(it holds \['opt'\]"),
])
def test_resume_from_a_checkpoint_it_cannot_take_names_the_file(
        tmp_path: Path, other: dict[str, str], message: str) -> None:
    if "file" in other:
        potluck.CheckpointManager(tmp_path).save(3, {"opt": {"lr": 0.1}})
    else:
        _saved(tmp_path)
    net = torch.nn.Linear(4, 2) if "net" not in other else torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    optimizer = (torch.optim.AdamW(net.parameters()) if "optimizer" in other
                 else torch.optim.SGD(net.parameters(), lr=0.1))
    with pytest.raises(ConfigError, match=message) as caught:
        _prepare(net, optimizer=optimizer, checkpoint_dir=tmp_path, resume=True)
    assert f"the checkpoint {tmp_path / 'ckpt-000000000003.pt'}" in str(caught.value)


@pytest.mark.parametrize("name", ["sync_gradients", "clock", "contribution"])
def test_dataparallel_options_prepare_sets_itself_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=f"prepare\\(\\) sets DataParallel's {name}= itself"):
        _prepare(**{name: None})


def test_a_model_with_nothing_to_train_is_refused() -> None:
    net = torch.nn.Linear(4, 2).requires_grad_(False)
    with pytest.raises(ConfigError, match="no parameter that requires a gradient"):
        _prepare(net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1))


def test_a_parameter_unfrozen_after_prepare_is_refused_at_the_next_step() -> None:
    """Its gradient was never in a bucket: it would train apart on every worker."""
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    net[0].requires_grad_(False)
    model, opt, loader = _prepare(net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1))  # type: ignore[misc]
    batches = iter(loader)
    x, y = next(batches)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    net[0].requires_grad_(True)  # unfrozen after step 1
    x, y = next(batches)
    torch.nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(ConfigError, match=r"\['0.bias', '0.weight'\] changed requires_grad"):
        opt.step()
    opt.finish()


def test_compressed_sum_refuses_a_codec_class() -> None:
    from potluck.compress import CompressedSum, Int8Blockwise

    with pytest.raises(ConfigError, match="with the parentheses"):
        CompressedSum(Int8Blockwise)  # type: ignore[arg-type]


def test_a_diloco_split_for_another_world_size_is_refused_at_prepare() -> None:
    """Not from inside the loader, a round into training."""
    with pytest.raises(ConfigError, match=r"DiLoCo\(split=\(30, 10\)\) for 1 ranks"):
        _prepare(sync=potluck.DiLoCo(inner_steps=20, split=(30, 10)))


def test_data_parallel_refuses_what_torch_ddp_refuses() -> None:
    with pytest.raises(ConfigError, match=r"takes a torch\.nn\.Module, got NoneType"):
        potluck.DataParallel(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no parameter that requires a gradient"):
        potluck.DataParallel(torch.nn.ReLU())


def test_the_loader_and_optimizer_answer_what_torch_code_asks_of_them() -> None:
    """len(loader) sizes schedulers and progress bars; opt.state and opt.defaults are
    the torch optimizer's; what cannot work is refused with what to do."""
    net = torch.nn.Linear(4, 2)
    model, opt, loader = potluck.prepare(
        net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), DATA, global_batch=6)
    assert len(loader) == 3  # 16 samples, 6 a step: 6, 6, 4
    loader.set_epoch(0)
    batches = 0
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        batches += 1
    assert batches == len(loader) and loader.epoch == 1
    assert opt.defaults["momentum"] == 0.9
    assert all("momentum_buffer" in opt.state[p] for p in net.parameters())
    with pytest.raises(ConfigError, match=r"set_epoch\(0\): the loader is at epoch 1"):
        loader.set_epoch(0)
    with pytest.raises(ConfigError, match="before prepare"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(1))]})
    with pytest.raises(ConfigError, match="takes no closure"):
        opt.step(lambda: 0.0)
    opt.finish()
