"""Checkpoint files and CheckpointManager in one process: atomicity, checksums, fallback,
retention, async saves and their errors, RNG round trips."""

from __future__ import annotations

import errno
import logging
import random
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

from potluck import events
from potluck.checkpoint import (
    CheckpointManager,
    DistributedRng,
    capture_rng,
    derive_rng,
    read_checkpoint,
    restore_rng,
    rng_for_rank,
)
from potluck.checkpoint.atomic import atomic_write
from potluck.cohort import Cohort
from potluck.cohort.current import clear_current, current, set_current
from potluck.data import DataCursor
from potluck.errors import CheckpointError, ConfigError, CorruptCheckpointError
from potluck.events import Note


def state(step: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(step)
    return {"weights": torch.randn(1000, generator=gen), "step": step, "name": f"s{step}"}


def test_atomic_write_leaves_nothing_on_exception(tmp_path: Path) -> None:
    target = tmp_path / "file.bin"
    target.write_bytes(b"old")

    def fail(file: Any) -> None:
        file.write(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, fail)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["file.bin"]


def test_round_trip_and_names(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    assert manager.load_latest() is None
    manager.save(7, state(7))
    step, loaded, path = manager.load_latest()  # type: ignore[misc]
    assert step == 7 and path.name == "ckpt-000000000007.pt"
    assert torch.equal(loaded["weights"], state(7)["weights"]) and loaded["name"] == "s7"


def test_each_written_checkpoint_is_noted_once_it_is_durable(tmp_path: Path) -> None:
    heard: list[Note] = []
    stop = events.listen(heard.append)
    try:
        manager = CheckpointManager(tmp_path)
        manager.save(3, state(3))
        manager.save(4, state(4), blocking=False)  # noted from the writing thread
        manager.wait()
        CheckpointManager(tmp_path, rank=1).save(5, state(5))  # not the writer: no file
    finally:
        stop()
    assert [(n.what, n.step) for n in heard] == [("checkpoint", 3), ("checkpoint", 4)]
    assert heard[1].text.startswith(f"step 4 saved to {tmp_path / 'ckpt-000000000004.pt'} (")
    assert heard[1].text.endswith(" s)") and " MB in " in heard[1].text


def test_a_checkpoint_older_than_the_kept_ones_is_pruned_at_once_without_error(
        tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=2)
    manager.save(8, state(8))
    manager.save(9, state(9))
    heard: list[Note] = []
    stop = events.listen(heard.append)
    try:
        manager.save(1, state(1))  # a new run into an old run's directory: kept are newer
    finally:
        stop()
    assert [step for step, _ in manager.checkpoints()] == [8, 9]
    assert [(n.what, n.step) for n in heard] == [("checkpoint", 1)]


def test_checksum_mismatch_is_detected(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(1, state(1))
    path = manager.checkpoints()[-1][1]
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="SHA-256"):
        read_checkpoint(path)


def test_truncated_file_falls_back_to_previous(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(1, state(1))
    manager.save(2, state(2))
    newest = manager.checkpoints()[-1][1]
    newest.write_bytes(newest.read_bytes()[:-10])
    with pytest.raises(CorruptCheckpointError, match="truncated"):
        read_checkpoint(newest)
    with caplog.at_level(logging.WARNING):
        step, loaded, _ = manager.load_latest()  # type: ignore[misc]
    assert step == 1 and torch.equal(loaded["weights"], state(1)["weights"])
    assert newest.name in caplog.text
    manager.checkpoints()[0][1].write_bytes(b"")
    with pytest.raises(CheckpointError, match="every checkpoint"):
        manager.load_latest()


def test_keep_k_newest(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=2)
    for step in range(5):
        manager.save(step, state(step))
    assert [step for step, _ in manager.checkpoints()] == [3, 4]
    with pytest.raises(ConfigError, match="keep=0"):
        CheckpointManager(tmp_path, keep=0)


def test_stale_temp_files_are_ignored_and_removed(tmp_path: Path) -> None:
    (tmp_path / ".ckpt-000000000009.pt.tmp-1-abcd").write_bytes(b"half")
    (tmp_path / "notes.txt").write_text("mine")
    manager = CheckpointManager(tmp_path)
    assert manager.checkpoints() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_async_save_copies_state_and_waits(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    weights = torch.zeros(100_000)
    pending = manager.save(1, {"weights": weights}, blocking=False)
    weights.add_(1.0)  # training goes on while the copy is written
    assert pending.wait() == tmp_path / "ckpt-000000000001.pt"
    assert manager.load_latest().state["weights"].sum() == 0  # type: ignore[union-attr]


def test_async_error_surfaces_at_next_save(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"bad": lambda: None}, blocking=False)  # cannot be pickled
    with pytest.raises(CheckpointError, match="background write"):
        manager.save(2, state(2))
    manager.save(3, state(3))  # the error was reported once; saving works again
    assert [s for s, _ in manager.checkpoints()] == [3]


def test_a_file_where_the_directory_should_be_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "ckpts"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError, match=f"checkpoint directory {blocker} is a file"):
        CheckpointManager(blocker)
    with pytest.raises(CheckpointError, match=f"cannot write checkpoints in {blocker / 'sub'}"):
        CheckpointManager(blocker / "sub")
    CheckpointManager(blocker, rank=1)  # a rank that never writes does not check


def _read_only(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.EROFS, "Read-only file system", "/ckpts/.ckpt-000000000001.pt.tmp-1")


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "background"])
def test_a_refused_write_is_one_clear_error_and_the_old_checkpoint_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blocking: bool) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(1, state(1))
    monkeypatch.setattr("potluck.checkpoint.manager.write_checkpoint", _read_only)
    with pytest.raises(CheckpointError, match="failed: Read-only file system; the newest "
                                              "checkpoint before it is intact") as caught:
        manager.save(2, state(2), blocking=blocking)
        manager.wait()
    assert isinstance(caught.value.__cause__, OSError)
    monkeypatch.undo()
    assert manager.load_latest().step == 1  # type: ignore[union-attr]


def test_atomic_write_raises_the_writes_error_not_the_cleanups(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    def write(file: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "unlink", refuse)
    with pytest.raises(OSError, match="No space left") as caught:
        atomic_write(tmp_path / "x", write)
    assert caught.value.__context__ is None  # the cleanup's failure is not chained in


def test_stateful_objects_restore(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    cursor = DataCursor(10, 3)
    cursor.commit()
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"model": model, "optimizer": optimizer, "cursor": cursor})
    model2 = torch.nn.Linear(3, 2)
    optimizer2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    cursor2 = DataCursor(10, 3)
    objects = {"model": model2, "optimizer": optimizer2, "cursor": cursor2}
    assert manager.restore_latest(objects) == 1
    assert torch.equal(model2.weight, model.weight) and cursor2.state == cursor.state
    assert optimizer2.state_dict()["state"][0]["momentum_buffer"] is not None
    with pytest.raises(CheckpointError, match="no entry 'scaler'"):
        manager.restore_latest({"scaler": torch.amp.GradScaler("cpu")})


def draws() -> tuple[float, float, torch.Tensor]:
    return random.random(), float(np.random.rand()), torch.rand(3)


def test_rng_round_trip_makes_next_draws_identical() -> None:
    saved = capture_rng()
    first = draws()
    restore_rng(saved)
    again = draws()
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])


def test_rng_survives_a_weights_only_checkpoint(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"rng": DistributedRng()})  # one process: a one-rank list
    first = draws()
    DistributedRng().load_state_dict(manager.load_latest().state["rng"])  # type: ignore[union-attr]
    again = draws()
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])


def test_missing_ranks_get_distinct_deterministic_states() -> None:
    saved = [capture_rng()]
    assert torch.equal(rng_for_rank(saved, 0)["torch"], saved[0]["torch"])
    one, two = rng_for_rank(saved, 1), rng_for_rank(saved, 2)
    assert torch.equal(one["torch"], rng_for_rank(saved, 1)["torch"])
    assert not torch.equal(one["torch"], two["torch"])
    assert not torch.equal(derive_rng(1)["torch"], derive_rng(2)["torch"])


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"directory": None}, r"directory=None is invalid: it must be a path \(str or os.PathLike\)"),
    ({"directory": 123}, r"directory=123 is invalid"),
    ({"rank": -1}, r"rank=-1 is invalid: it must be an integer >= 0 .*pass cohort.rank"),
    ({"rank": "0"}, r"rank='0' is invalid"),
    ({"rank": True}, r"rank=True is invalid"),
    ({"rank": 1.0}, r"rank=1.0 is invalid"),
], ids=["dir-None", "dir-int", "rank-negative", "rank-str", "rank-bool", "rank-float"])
def test_bad_directory_or_rank_is_a_config_error(tmp_path: Path, kwargs: dict[str, Any],
                                                 match: str) -> None:
    arguments: dict[str, Any] = {"directory": tmp_path, **kwargs}
    directory = arguments.pop("directory")
    with pytest.raises(ConfigError, match=match):
        CheckpointManager(directory, **arguments)
    CheckpointManager(str(tmp_path), rank=3)  # a str and any rank >= 0 are fine


@pytest.mark.timeout(30)
@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "background"])
def test_state_the_loader_refuses_fails_at_the_first_save_and_leaves_no_file(
        tmp_path: Path, blocking: bool) -> None:
    CheckpointManager(tmp_path).save(1, state(1))  # an earlier run's good checkpoint
    manager = CheckpointManager(tmp_path, keep=1)
    with pytest.raises(CheckpointError, match=r"step 2 could not be loaded back with "
                       r"weights_only=True \(Unsupported global: GLOBAL object was not an "
                       r"allowed global by default\), so it was deleted: keep only tensors "
                       r".*weights_only=False\) if you trust the files"):
        manager.save(2, {"o": object()}, blocking=blocking)
        manager.wait()
    assert [step for step, _ in manager.checkpoints()] == [1]  # read back before pruning
    assert manager.load_latest().step == 1  # type: ignore[union-attr]
    manager.save(3, state(3))  # plain state: saving works again
    assert [step for step, _ in manager.checkpoints()] == [3]
    trusting = CheckpointManager(tmp_path / "trusted", weights_only=False)
    trusting.save(4, {"o": object()})  # the loader takes it too: nothing to refuse
    assert type(trusting.load_latest().state["o"]) is object  # type: ignore[union-attr]


@pytest.mark.timeout(30)
def test_only_the_first_write_is_read_back(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[Path] = []

    def counting(path: Path, *, weights_only: bool = True) -> Any:
        reads.append(path)
        return read_checkpoint(path, weights_only=weights_only)

    monkeypatch.setattr("potluck.checkpoint.manager.read_checkpoint", counting)
    manager = CheckpointManager(tmp_path)
    manager.save(1, state(1))
    manager.save(2, state(2), blocking=False)
    manager.save(3, state(3))
    assert reads == [tmp_path / "ckpt-000000000001.pt"]


class _Member:
    """Stands in for the current cohort: only its rank is asked."""

    def __init__(self, rank: int) -> None:
        self.rank = rank


@pytest.mark.timeout(30)
def test_the_writer_follows_the_current_cohorts_rank_at_each_save(tmp_path: Path) -> None:
    directory = tmp_path / "ckpts"
    member = _Member(rank=1)
    set_current(cast(Cohort, member))
    try:
        manager = CheckpointManager(directory)
        assert not manager.is_writer and not directory.exists()  # not the writer: no I/O
        assert manager.save(1, state(1)).wait() is None
        directory.mkdir()
        stale = directory / ".ckpt-000000000009.pt.tmp-1-abcd"  # a killed writer's
        stale.write_bytes(b"half")
        member.rank = 0  # the old rank 0 is gone; the cohort renumbered this worker
        assert manager.is_writer
        assert manager.save(2, state(2)).wait() == directory / "ckpt-000000000002.pt"
        assert sorted(p.name for p in directory.iterdir()) == ["ckpt-000000000002.pt"]
        assert CheckpointManager(directory, rank=1).rank == 1  # an explicit rank wins
    finally:
        clear_current(cast(Cohort, member))
    assert current() is None and manager.rank == 0  # no cohort, no default group: 0


@pytest.mark.timeout(30)
def test_init_makes_its_cohort_current_until_closed() -> None:
    import potluck
    from potluck.env import WorkerEnv

    with potluck.init(env=WorkerEnv()) as cohort:
        assert current() is cohort
        assert DistributedRng().state_dict()["world_size"] == 1
    assert current() is None
