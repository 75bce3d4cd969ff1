"""What ``potluck.prepare`` refuses before it trains a step (pure, but for the cohort's
one agreement all-gather in ``agree_everywhere``).

Each check stops a mistake that would otherwise train silently wrong or fail far from
its cause: an optimizer over another model's parameters (nothing trained), ranks that
disagree on the data's order or size (samples trained twice or never), an epoch whose
last step has fewer samples than workers (a crash after a whole epoch), a dataset
shorter than one global batch (every step smaller than asked), a value of the wrong
type (a traceback from deep inside).
"""

from __future__ import annotations

import dataclasses
import hashlib
import numbers
from pathlib import Path
from typing import Any

import torch
from torch import nn

from potluck.cohort import Cohort
from potluck.collectives import allgather_object, allgather_tensor
from potluck.errors import ConfigError
from potluck.group import GroupHandle
from potluck.protocol import FIX, running
from potluck.step.minimum import MinimumSize
from potluck.step.parts import SharePolicy


def whole_number(name: str, value: Any, example: str) -> int:
    """``value`` as an int if it is a whole number (a numpy integer too; not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name}={value!r} must be an int, e.g. {example}")
    return int(value)


def check_call(model: Any, optimizer: Any, dataset: Any, global_batch: Any, seed: Any,
               drop_last: Any, data_parallel: dict[str, Any]) -> tuple[int, int]:
    """``prepare``'s model, optimizer and step arguments: the global batch and seed as
    ints, or the refusal that names the bad value and the fix."""
    from potluck.reducer import DataParallel

    if not isinstance(model, nn.Module) or isinstance(model, DataParallel):
        raise ConfigError(
            f"prepare() takes the plain model (an nn.Module), got {type(model).__name__}; "
            "pass the module itself: prepare wraps it in potluck.DataParallel")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(
            f"prepare() takes a torch.optim.Optimizer over the model's parameters, got "
            f"{type(optimizer).__name__}")
    check_optimizer(model, optimizer)
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"prepare() got a model ({type(model).__name__}) with no parameter "
                          "that requires a gradient: there is nothing to train or sync; set "
                          "requires_grad=True on the parameters to train before prepare()")
    global_batch = whole_number("global_batch", global_batch, "global_batch=64")
    if global_batch < 1:
        raise ConfigError(f"global_batch={global_batch!r} must be a positive int (samples "
                          "per step, all workers together), e.g. global_batch=64")
    if not isinstance(drop_last, bool):
        raise ConfigError(f"drop_last={drop_last!r} must be True or False (leave out an "
                          "epoch's last, shorter step)")
    for name in ("group", "process_group", "on_failure", "init_sync", "sync_gradients",
                 "clock", "contribution"):
        if name in data_parallel:
            raise ConfigError(f"prepare() sets DataParallel's {name}= itself (from the "
                              f"cohort, sync= and balance=); drop {name}= (or build "
                              "DataParallel yourself)")
    return global_batch, whole_number("seed", seed, "seed=0")


def check_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every parameter ``optimizer`` updates is one of ``model``'s: a parameter outside
    the model is never averaged across ranks (the replicas would drift apart), and an
    optimizer over another model trains nothing here."""
    own = {id(p) for p in model.parameters()}
    held = [p for group in optimizer.param_groups for p in group["params"]]
    foreign = [p for p in held if id(p) not in own]
    if not foreign:
        return
    if len(foreign) == len(held):
        raise ConfigError(
            f"prepare(): the optimizer holds {len(held)} parameter(s), none of them the "
            "model's, so training would never change the model; build the optimizer over "
            "this model, e.g. torch.optim.SGD(model.parameters(), lr=...)")
    shapes = ", ".join(str(tuple(p.shape)) for p in foreign[:3])
    raise ConfigError(
        f"prepare(): the optimizer holds {len(foreign)} parameter(s) that are not the "
        f"model's (shapes {shapes}{', ...' if len(foreign) > 3 else ''}); their gradients "
        "would not be averaged across workers, so the replicas would drift apart; make them "
        "part of the model (an nn.Parameter of a submodule) or leave them out of the "
        "optimizer")


def check_arguments(dataset: Any, collate: Any, clip_grad_norm: Any,
                    shares: Any, minimum: Any, metrics_dir: Any) -> None:
    """The arguments whose type is checked nowhere else before they are used."""
    if isinstance(dataset, torch.utils.data.IterableDataset) or not (
            hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise ConfigError(
            f"prepare() takes a map-style dataset (len(dataset) and dataset[i]), got "
            f"{type(dataset).__name__}; the data cursor hands out sample indices, so wrap "
            "an iterable in a list or a torch.utils.data.Dataset")
    if collate is not None and not callable(collate):
        raise ConfigError(f"collate={collate!r} must be a function of a list of samples "
                          "returning a batch (default: torch's default_collate)")
    if clip_grad_norm is not None and (isinstance(clip_grad_norm, bool) or not isinstance(
            clip_grad_norm, numbers.Real) or not float(clip_grad_norm) > 0):
        raise ConfigError(f"clip_grad_norm={clip_grad_norm!r} must be a positive number "
                          "(the largest global gradient norm), e.g. 1.0, or None")
    if shares is not None and not isinstance(shares, SharePolicy):
        raise ConfigError(f"shares={shares!r} must be a share policy: a step part "
                          "(potluck.step.parts.SharePolicy: name, shares(world_size) -> a "
                          "weight per rank, on_commit, on_membership, state_dict, "
                          "load_state_dict); leave it out for equal shares, or pass "
                          "balance=True for shares by measured speed")
    if minimum is not None and not isinstance(minimum, MinimumSize):
        raise ConfigError(f"minimum={minimum!r} must be a potluck.MinimumSize(workers, "
                          f"timeout), e.g. minimum=potluck.MinimumSize({minimum!r}, 60)"
                          if isinstance(minimum, int) else
                          f"minimum={minimum!r} must be a potluck.MinimumSize(workers, "
                          "timeout)")
    if metrics_dir is not None:
        check_directory("metrics_dir", metrics_dir)


# torch DataLoader's options: prepare's loader has its own (or none)
_LOADER_OPTIONS = {
    "collate_fn": "pass collate= (a function of a list of samples)",
    "batch_size": "pass global_batch= (samples per step, all workers together)",
    "shuffle": "the loader walks a seeded permutation of the data every epoch (seed=)",
    "sampler": "the data cursor picks each rank's samples",
    "batch_sampler": "the data cursor picks each rank's samples",
    "prefetch_factor": "pass prefetch= (steps read ahead by the num_workers processes)",
    "persistent_workers": "the worker processes (num_workers=) live as long as the loader",
    "worker_init_fn": "each sample is read under a seed of its own (docs/data-parallel.md); "
                      "open files or connections lazily in __getitem__",
    "pin_memory": "a batch is moved to the cohort's device in the training process",
    "multiprocessing_context": "the worker processes (num_workers=) use Python's default",
    "generator": "the order comes from seed=",
    "timeout_s": "pass read_timeout= (seconds a worker's batch is waited for; prepare's "
                 "timeout= is the collectives')",
    "in_order": "batches come in the cursor's order",
}


def check_setup(cohort: Any, checkpoint_dir: Any, resume: Any,
                timeout: Any, data_parallel: dict[str, Any]) -> None:
    """``prepare``'s own arguments not checked elsewhere, and torch DataLoader options
    given to it (they would reach DataParallel, whose error would not say so)."""
    loader = sorted(set(data_parallel) & set(_LOADER_OPTIONS))
    if loader:
        raise ConfigError(
            f"prepare() got torch DataLoader option(s) {loader}: prepare's loader is not a "
            "DataLoader; " + "; ".join(f"{name}: {_LOADER_OPTIONS[name]}" for name in loader))
    if cohort is not None and not isinstance(cohort, Cohort):
        raise ConfigError(f"cohort={cohort!r} must be a potluck.Cohort (potluck.init()'s), "
                          "or None to join the job the launcher started")
    if checkpoint_dir is not None and not isinstance(checkpoint_dir, (str, Path)):
        raise ConfigError(f"checkpoint_dir={checkpoint_dir!r} must be a path (str or "
                          "pathlib.Path), or None")
    if checkpoint_dir is not None:  # now, not when a stop below the minimum writes there
        check_directory("checkpoint_dir", checkpoint_dir)
    if not isinstance(resume, bool):
        raise ConfigError(f"resume={resume!r} must be True or False (resume from "
                          "checkpoint_dir's latest live state)")
    if (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real)
            or not float(timeout) > 0):
        raise ConfigError(f"timeout={timeout!r} must be a positive number of seconds, e.g. "
                          "timeout=60")


def check_directory(name: str, path: Any) -> None:
    """``path`` is a directory or can be made one (its nearest existing ancestor is a
    directory)."""
    if not isinstance(path, (str, Path)):
        raise ConfigError(f"{name}={path!r} must be a path (str or pathlib.Path)")
    here = Path(path)
    if here.exists() and not here.is_dir():
        raise ConfigError(f"{name}={str(path)!r} is a file, not a directory; pass a "
                          "directory (it is made if it does not exist)")
    for parent in here.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{name}={str(path)!r} cannot be made: {parent} is a "
                                  "file; pass a directory path")
            return


def check_split(dataset_len: int, global_batch: int, world_size: int, drop_last: bool,
                steps_per_block: int = 1) -> None:
    """Every step of an epoch gives every rank at least one sample: a global batch of at
    least the world size, and (without ``drop_last``) an epoch's last, shorter block of
    none or of at least the world size. A dataset shorter than one global batch is
    refused: no step would ever have ``global_batch`` samples. ``steps_per_block``: a
    sync strategy's round of global batches, the cursor's block (its last round is split
    among the ranks). An elastic cohort's world size changes later: this checks the one
    it starts with."""
    if global_batch < world_size:
        raise ConfigError(
            f"global_batch={global_batch} is smaller than the {world_size} workers: every "
            "worker needs at least one sample a step; use a global batch of at least "
            f"{world_size}")
    if dataset_len < global_batch:  # (a shorter last step is fine: not every step)
        raise ConfigError(
            f"the dataset has {dataset_len} samples, fewer than global_batch={global_batch}: "
            f"every step would train on {dataset_len} samples, not {global_batch}; pass "
            f"global_batch={dataset_len} or less, or a larger dataset")
    block = global_batch * steps_per_block
    tail = dataset_len % block
    if drop_last or tail == 0 or tail >= world_size:
        return
    what = "step" if steps_per_block == 1 else "round"
    raise ConfigError(
        f"the dataset's {dataset_len} samples end each epoch with a {what} of {tail} "
        f"sample(s) ({what}s of {block}), fewer than the {world_size} workers, so a worker "
        f"would have none in it; pass drop_last=True (that {what} is left out), or use a "
        f"dataset length whose last {what} has at least {world_size} samples")


def agree(cohort: Cohort, dataset_len: int, global_batch: int, seed: int, drop_last: bool,
          steps_per_block: int, settings: dict[str, Any]) -> dict[str, int | str]:
    """What every rank must agree on (``signature``), agreed by the founders; then the
    split of every step checked for this world size. A joiner compares its settings with
    the live state's, which the founders agreed on here (``LiveState.receive``)."""
    agreed = signature(dataset_len, global_batch, seed, drop_last, settings)
    if cohort.world_size > 1 and not cohort.joined_late:  # first: every rank then fails
        agree_everywhere(cohort.group, agreed, cohort.device)  # alike below
    check_split(dataset_len, global_batch, cohort.world_size, drop_last, steps_per_block)
    return agreed


def agree_everywhere(group: GroupHandle, values: dict[str, int | str],
                     device: torch.device) -> None:
    """Every rank passed the same ``values`` (one all-gather of one word: the hash of
    the names and values; only when ranks differ are the values themselves gathered to
    show them): ranks with another
    seed, global batch or dataset length would each walk their own order of the data,
    and some samples would be trained twice and others never, with no error anywhere;
    ranks with other settings (``signature``'s texts) would sync differently, which
    ends in a hang, a crash or replicas drifting apart. These two gathers (one word,
    then ``allgather_object``) must stay as they are in every later version, whatever
    ``protocol.WIRE`` says: then a rank of another version, whose settings may have
    other names, is named with its potluck, not left waiting on a gather of another
    size (a version from before them, which gathered a word per setting, is not)."""
    mine = torch.tensor([_as_word(repr(sorted(values.items())))], dtype=torch.int64,
                        device=device)  # (NCCL takes only its device's tensors)
    if len({tuple(row.tolist()) for row in allgather_tensor(mine, group)}) == 1:
        return
    rows: list[dict[str, int | str]] = allgather_object(values, group, device)
    names = list(dict.fromkeys(name for row in rows for name in row))
    differ = [name for name in names if len({repr(row.get(name)) for row in rows}) > 1]
    table = "; ".join(f"{name}: " + ", ".join(f"rank {r} {row.get(name)}"
                                              for r, row in enumerate(rows))
                      for name in differ)
    if "potluck" in differ:
        raise ConfigError(f"the workers run different potluck ({table}): they would not "
                          f"run the same collectives (a hang or garbage); {FIX}")
    raise ConfigError(
        f"the workers called prepare() with different {', '.join(differ)} "
        f"({table}); every worker must pass the same dataset, global_batch, seed, "
        "drop_last, sync, balance, trust and DataParallel options, or the data would not "
        "be split exactly once among them and the workers would not sync alike")


def _as_word(value: int | str) -> int:
    if isinstance(value, str):
        return int.from_bytes(hashlib.sha256(value.encode()).digest()[:8], "big") >> 1
    return value % (1 << 63)


def describe(value: Any) -> str:
    """A text for a setting that is the same in every process for the same setting: a
    dataclass by its type and fields, a function by its qualified name (a default
    ``repr`` holds a memory address, which differs between processes), potluck's own
    objects (codecs, hooks) by their type and public fields; anyone else's object by its
    type alone (its fields may rightly differ between ranks)."""
    if isinstance(value, float) and value.is_integer():  # 1.0 and 1 are one setting
        return repr(int(value))
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(describe(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {describe(value[k])}" for k in sorted(value, key=str)) + "}"
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)}"
    if hasattr(value, "__qualname__"):  # a function or a class
        return f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
    kind = type(value).__qualname__
    if dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    elif type(value).__module__.startswith("potluck."):
        fields = {k: v for k, v in vars(value).items() if not k.startswith("_")}
    else:
        return kind
    return kind + "(" + ", ".join(f"{k}={describe(v)}" for k, v in fields.items()) + ")"


def signature(dataset_len: int, global_batch: int, seed: int, drop_last: bool,
              settings: dict[str, Any]) -> dict[str, int | str]:
    """What every rank must agree on: potluck itself (``protocol.running``: version and
    wire), the data's size and order, so that it is split exactly once, and ``settings``
    (sync, balance, trust, DataParallel's options), so that every rank syncs alike."""
    return {"potluck": running(), "len(dataset)": dataset_len, "global_batch": global_batch,
            "seed": seed, "drop_last": int(drop_last),
            **{k: describe(v) for k, v in settings.items()}}
