"""The step loader's worker processes (``num_workers``): the batches they read ahead are
the ones the training process would read, bit for bit, augmentations included; a
redone step, a membership change or new shares still get exactly the step the cursor
points at; a dataset's error comes through, a dead worker stops the loop, and no worker
outlives the loader or the training process."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy
import pytest
import torch
from torch.utils.data import default_collate

from potluck.data import DataCursor
from potluck.data.fetch import BatchKey, Draws, Planned, read_batches, seeded_read
from potluck.data.step_loader import StepLoader
from potluck.data.workers import WorkerPool
from potluck.errors import ConfigError, CursorError, LoaderWorkerError

SIZE, BATCH = 60, 6


class Augmenting(torch.utils.data.Dataset[Any]):
    """Each sample drawn with torch's, Python's and NumPy's random state."""

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, float, float]:
        return (torch.tensor([float(i)]), torch.rand(3), random.random(),
                float(numpy.random.rand()))


class Failing(Augmenting):
    def __init__(self, bad: int, kill: bool = False) -> None:
        self.bad, self.kill, self.parent = bad, kill, os.getpid()

    def __getitem__(self, i: int) -> Any:
        if i == self.bad and self.kill and os.getpid() != self.parent:
            os.kill(os.getpid(), signal.SIGKILL)  # a worker killed (as by the OOM killer)
        if i == self.bad and not self.kill:
            raise KeyError(f"sample {i} is missing")
        return super().__getitem__(i)


class Hanging(Augmenting):
    """``__getitem__(bad)`` never returns in a worker process."""

    def __init__(self, bad: int) -> None:
        self.bad, self.parent = bad, os.getpid()

    def __getitem__(self, i: int) -> Any:
        if i == self.bad and os.getpid() != self.parent:
            time.sleep(3600)
        return super().__getitem__(i)


def _loader(workers: int, membership: Callable[[], tuple[int, int]], *,
            dataset: Any = None, shares: Callable[[int], list[float]] | None = None,
            redone: Callable[[], int] | None = None,
            read_timeout: float | None = None) -> StepLoader:
    cursor = DataCursor(SIZE, BATCH, seed=7)
    kwargs: dict[str, Any] = {"shares": shares} if shares is not None else {}
    return StepLoader(dataset or Augmenting(), cursor, membership, workers=workers,
                      prefetch=2, redone=redone, read_timeout=read_timeout, **kwargs)


def _epochs(loader: StepLoader, epochs: int) -> list[Any]:
    out = []
    while loader.epoch < epochs:
        for batch in loader:
            out.append(batch)
            loader.cursor.commit()
    return out


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]), (x, y)
        assert torch.equal(x[2], y[2]) and torch.equal(x[3], y[3]), (x, y)


@pytest.mark.timeout(60)
def test_workers_read_the_batches_the_training_process_would() -> None:
    """Uneven shares, two epochs (the next epoch's first steps are read ahead too)."""
    shares = lambda n: [3.0, 1.0, 2.0]  # noqa: E731
    plain = _epochs(_loader(0, lambda: (1, 3), shares=shares), 2)
    loader = _loader(2, lambda: (1, 3), shares=shares)
    ahead = _epochs(loader, 2)
    loader.close()
    _same(plain, ahead)
    assert [b[0].view(-1).tolist() for b in plain[:2]] != [[]] * 2
    assert len({tuple(b[1].view(-1).tolist()) for b in plain}) == len(plain)  # drawn anew
    pool = loader.fetcher
    assert isinstance(pool, WorkerPool)
    assert pool.hits >= len(plain) - 2, (pool.hits, pool.misses)  # all but a first read


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_reads_alike_however_its_step_is_split(workers: int) -> None:
    """One rank or three by uneven shares: each sample's random draws are its own, so
    N ranks train as one process would on the same global batch."""
    def by_index(batches: list[Any]) -> dict[int, tuple[Any, ...]]:
        return {int(b[0][k]): (b[1][k].tolist(), float(b[2][k]), float(b[3][k]))
                for b in batches for k in range(len(b[0]))}

    alone = by_index(_epochs(_loader(0, lambda: (0, 1)), 1))
    split: dict[int, tuple[Any, ...]] = {}
    for rank in range(3):
        loader = _loader(workers, lambda r=rank: (r, 3),  # type: ignore[misc]
                         shares=lambda n: [1.0, 3.0, 2.0])
        split.update(by_index(_epochs(loader, 1)))
        loader.close()
    assert sorted(alone) == sorted(split) == list(range(SIZE))
    assert alone == split


def test_only_the_generators_a_dataset_draws_from_are_seeded_per_sample() -> None:
    """A dataset that draws nothing pays no seeding; one that draws is read again once
    with its generators seeded, and reads alike from then on."""
    planned = Planned(BatchKey(0, 0, 4), [3, 1, 4, 2], 7)
    plain, draws = torch.utils.data.TensorDataset(torch.arange(10.0)), Draws()
    seeded_read(plain, default_collate, planned, draws)
    assert draws.seeded == set()

    class OnlyPython(torch.utils.data.Dataset[Any]):
        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int) -> float:
            return i + random.random()

    draws = Draws()
    first = seeded_read(OnlyPython(), default_collate, planned, draws)
    assert draws.seeded == {"random"}
    again = seeded_read(OnlyPython(), default_collate, planned, Draws())
    assert torch.equal(first, again)
    single = seeded_read(OnlyPython(), default_collate,
                         Planned(BatchKey(0, 1, 2), [1], 7), Draws())
    assert float(single[0]) == float(first[1])  # position 1 alike, alone or in the batch


def test_runs_read_at_once_equal_runs_read_one_by_one() -> None:
    """``read_batches`` (the work check's read of many runs) reads each run as
    ``seeded_read`` does alone, augmentations included, and puts the random state back."""
    runs = [Planned(BatchKey(0, s, s + 3), [(7 * s + k) % SIZE for k in range(3)], 9)
            for s in (0, 10, 40)]
    alone = [seeded_read(Augmenting(), default_collate, run, Draws()) for run in runs]
    torch.manual_seed(3)
    before = torch.get_rng_state()
    together = read_batches(Augmenting(), default_collate, runs)
    assert torch.equal(torch.get_rng_state(), before)
    for a, b in zip(alone, together, strict=True):
        assert all(torch.equal(torch.as_tensor(x), torch.as_tensor(y))
                   for x, y in zip(a, b, strict=True))


def test_reading_leaves_the_training_random_state_alone() -> None:
    torch.manual_seed(5)
    random.seed(5)
    numpy.random.seed(5)
    before = torch.get_rng_state(), random.getstate(), numpy.random.get_state()[1].copy()
    loader = _loader(0, lambda: (0, 2))
    next(iter(loader))
    assert torch.equal(torch.get_rng_state(), before[0])
    assert random.getstate() == before[1]
    assert (numpy.random.get_state()[1] == before[2]).all()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_member_leaving_mid_epoch_still_reads_every_sample_once(workers: int) -> None:
    """Three ranks' loaders in lockstep; after two steps rank 2 leaves: what the
    workers read ahead for three ranks is dropped, and the rest of the epoch is split
    between two."""
    steps = [0]
    world = lambda: 3 if steps[0] < 2 else 2  # noqa: E731
    loaders = [_loader(workers, lambda r=r: (r, world()))  # type: ignore[misc]
               for r in range(3)]
    seen: list[int] = []
    iterators = [iter(loader) for loader in loaders]
    while True:
        alive = range(world())
        batches = [next(iterators[r], None) for r in alive]
        if batches[0] is None:
            break
        for r, batch in zip(alive, batches, strict=True):
            seen += [int(v) for v in batch[0].view(-1).tolist()]
            loaders[r].cursor.commit()
        if steps[0] == 1:
            loaders[2].close()  # (it left)
        steps[0] += 1
    for loader in loaders:
        loader.close()
    assert sorted(seen) == list(range(SIZE))


@pytest.mark.timeout(60)
def test_a_redone_step_gets_the_same_batch_again() -> None:
    redone = [0]
    loader = _loader(2, lambda: (0, 2), redone=lambda: redone[0])
    iterator = iter(loader)
    first = next(iterator)
    loader.cursor.commit()
    second = next(iterator)
    redone[0] += 1  # the step failed: not committed, handed out again
    again = next(iterator)
    _same([second], [again])
    assert not torch.equal(first[0], second[0])
    loader.close()
    plain = _loader(0, lambda: (0, 2))
    _same(_epochs(plain, 1)[:2], [first, second])


@pytest.mark.timeout(60)
def test_a_dataset_error_in_a_worker_reaches_the_loop_as_itself() -> None:
    order = DataCursor(SIZE, BATCH, seed=7).permutation(0)
    bad = int(order[4 * BATCH])  # read ahead by a worker, not the first batch
    loader = _loader(2, lambda: (0, 1), dataset=Failing(bad))
    with pytest.raises(KeyError, match=f"sample {bad} is missing") as caught:
        _epochs(loader, 1)
    if sys.version_info >= (3, 11):
        assert "in potluck loader worker" in "".join(getattr(caught.value, "__notes__", []))
    loader.close()


@pytest.mark.timeout(60)
def test_a_killed_worker_stops_the_loop_with_what_to_do() -> None:
    order = DataCursor(SIZE, BATCH, seed=7).permutation(0)
    loader = _loader(2, lambda: (0, 1), dataset=Failing(int(order[3 * BATCH]), kill=True))
    with pytest.raises(LoaderWorkerError, match=r"loader worker process .* died.*num_workers"):
        _epochs(loader, 1)
    loader.close()


def _hung_batch() -> int:
    """A sample of the third batch: read ahead by a worker while the first is handed out."""
    return int(DataCursor(SIZE, BATCH, seed=7).permutation(0)[2 * BATCH])


@pytest.mark.timeout(60)
def test_a_read_that_hangs_does_not_hold_up_close(monkeypatch: pytest.MonkeyPatch) -> None:
    import potluck.data.workers as workers

    monkeypatch.setattr(workers, "CLOSE_GRACE", 0.5)
    before = set(_children())
    loader = _loader(2, lambda: (0, 1), dataset=Hanging(_hung_batch()))
    next(iter(loader))  # the workers now read the next two batches: one never ends
    started = [pid for pid in _children() if pid not in before]
    time.sleep(0.3)
    began = time.monotonic()
    loader.close()
    assert time.monotonic() - began < 15, "close() waited on the hung read"
    assert _gone(started, 20), f"workers {started} still running after close()"


@pytest.mark.timeout(60)
def test_a_read_past_read_timeout_stops_the_loop_with_what_to_do(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import potluck.data.workers as workers

    monkeypatch.setattr(workers, "CLOSE_GRACE", 0.5)
    bad = _hung_batch()
    loader = _loader(2, lambda: (0, 1), dataset=Hanging(bad), read_timeout=1.0)
    with pytest.raises(LoaderWorkerError, match=r"did not read the batch of samples \[.*"
                       r"within read_timeout=1 s.*Raise read_timeout") as caught:
        _epochs(loader, 1)
    assert str(bad) in str(caught.value)
    loader.close()


_HUNG_AT_EXIT = """
import sys, time
sys.path[:0] = [{root!r}, {src!r}]
from tests.unit.test_loader_workers import Hanging, _hung_batch, _loader
loader = _loader(2, lambda: (0, 1), dataset=Hanging(_hung_batch()))
next(iter(loader))
time.sleep(0.3)
print("exiting", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_read_that_hangs_does_not_hold_up_the_exit() -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = _HUNG_AT_EXIT.format(root=root, src=os.path.join(root, "src"))
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=45)
    assert done.returncode == 0 and "exiting" in done.stdout, done.stderr
    assert time.monotonic() - began < 40
    assert "terminated (a dataset __getitem__ that hangs)" in done.stderr, done.stderr


def test_bad_worker_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="num_workers=-1 must be an int >= 0"):
        _loader(-1, lambda: (0, 1))
    with pytest.raises(ConfigError, match="prefetch=0 must be an int >= 1"):
        StepLoader(Augmenting(), DataCursor(SIZE, BATCH), lambda: (0, 1), workers=1,
                   prefetch=0)
    with pytest.raises(ConfigError, match="read_timeout=0 must be a positive number"):
        _loader(1, lambda: (0, 1), read_timeout=0)
    with pytest.raises(ConfigError, match="read_timeout=5 with num_workers=0"):
        _loader(0, lambda: (0, 1), read_timeout=5)
    with pytest.raises(CursorError, match="no step was handed out"):
        _loader(0, lambda: (0, 1)).part_of(0)


def _gone(pids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(os.path.exists(f"/proc/{pid}") and _alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # (a zombie is gone)
    except OSError:
        return False


def _children() -> list[int]:
    import multiprocessing

    return [p.pid for p in multiprocessing.active_children() if p.pid is not None]


@pytest.mark.timeout(60)
def test_workers_end_with_the_loader() -> None:
    before = set(_children())
    loader = _loader(2, lambda: (0, 1))
    next(iter(loader))
    started = [pid for pid in _children() if pid not in before]
    assert started, "no worker process started"
    loader.close()
    assert _gone(started, 20), f"workers {started} still running after close()"


_KILLED_TRAINER = """
import os, sys, time, multiprocessing
sys.path[:0] = [{root!r}, {src!r}]
from tests.unit.test_loader_workers import _loader
loader = _loader(2, lambda: (0, 1))
next(iter(loader))
print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
time.sleep(60)
"""


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_a_killed_training_process() -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = _KILLED_TRAINER.format(root=root, src=os.path.join(root, "src"))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids, "the training process reported no worker"
        proc.kill()
        proc.wait(10)
        assert _gone(pids, 20), f"workers {pids} outlived the killed training process"
    finally:
        proc.kill()
        proc.wait(10)
