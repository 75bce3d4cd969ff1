"""The live state of a training job, and moving it between members.

The live state is everything a worker needs to train on from the next step as if it
had been there all along: model parameters and buffers, the optimizer (and scaler), the
data cursor, the committed step count, the reducer's bucket order, and every step
part's own state. A member sends it to joiners; after a recovery the most advanced
member sends it to the others; a checkpoint stores it, and resume reads it back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from potluck.checkpoint import CheckpointManager
from potluck.cohort import Cohort
from potluck.collectives import allgather_tensor, broadcast_object
from potluck.data import DataCursor
from potluck.errors import ConfigError, PeerLostError, RendezvousError
from potluck.protocol import FIX
from potluck.reducer import DataParallel
from potluck.step.guard import GuardedOptimizer
from potluck.step.parts import StepPart

# How long members wait for an admitted joiner to take the live state: its own setup
# between joining and building its optimizer (say, a first optimizer's imports) may take
# seconds. A joiner that dies meanwhile is noticed at once (closed connection).
STATE_TIMEOUT = timedelta(seconds=120)
# How many times a joiner whose live state did not arrive joins again. Each failure is
# a member lost during the broadcast (or the state's timeout): rare, but churn makes it.
REJOINS = 3

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """Commits and steps redone here. ``steps`` counts every commit (the same on every
    member): a round that lost a member's part commits, and so does that part when it
    is trained again. ``partial`` counts the commits after which the cursor still owed
    such a part, so ``steps - partial`` is the number of whole steps (rounds) trained."""

    steps: int = 0
    redone: int = 0
    partial: int = 0

    @property
    def whole(self) -> int:
        """Steps (rounds) whose every sample reached the model."""
        return self.steps - self.partial


class LiveState:
    """Gathers and applies the live state; sends, receives and realigns it."""

    def __init__(self, model: DataParallel, optimizer: GuardedOptimizer, cursor: DataCursor,
                 progress: Progress, parts: tuple[StepPart, ...],
                 settings: Mapping[str, int | str] | None = None) -> None:
        """``settings``: what ``prepare`` was called with that every member must share
        (``prepare_checks.signature``); a joiner's are compared with the cohort's."""
        self._model, self._optimizer, self._cursor = model, optimizer, cursor
        self._progress, self._parts = progress, parts
        self._settings = dict(settings) if settings is not None else None

    def capture(self) -> dict[str, Any]:
        """The live state, every tensor on the CPU (a receiver on another GPU, or with
        fewer GPUs, loads it onto its own device: ``apply`` copies into place)."""
        state: dict[str, Any] = _on_cpu({
            "model": self._model.module.state_dict(),
            "optimizer": self._optimizer.state_dict(),
            "cursor": self._cursor.state_dict(), "steps": self._progress.steps,
            "partial": self._progress.partial,
            "bucket_order": self._model.reducer.bucket_order(),
            "parts": {part.name: part.state_dict() for part in self._parts}})
        if self._settings is not None:
            state["settings"] = dict(self._settings)
        return state

    def apply(self, state: dict[str, Any], source: str = "the cohort's live state") -> None:
        """Take ``state`` (from ``source``, named in an error: a checkpoint's path)."""
        _check_state(state, source)
        try:
            self._model.module.load_state_dict(state["model"])
        except RuntimeError as exc:
            raise ConfigError(f"{source} holds another model than this one: {exc}; resume "
                              "with the model it was saved from, or start afresh without "
                              "resume=True (or from an empty checkpoint directory)") from exc
        self._optimizer.load_state_dict(state["optimizer"])
        _check_optimizer(self._optimizer.optimizer, source)
        seed, saved_seed = self._cursor.state.seed, state["cursor"].get("seed")
        self._cursor.load_state_dict(state["cursor"])  # the saved seed: the epoch goes on
        if saved_seed is not None and int(saved_seed) != seed:  # in the order it began
            log.warning("the live state's data order has seed=%s; this worker's seed=%s is "
                        "not used (the epoch goes on in the order it began, so that every "
                        "sample is still trained on exactly once)", saved_seed, seed)
        self._progress.steps = int(state["steps"])
        self._progress.partial = int(state.get("partial", 0))
        self._model.reducer.adopt_bucket_order(state["bucket_order"])
        saved = state.get("parts", {})
        for part in self._parts:
            if part.name in saved:
                part.load_state_dict(saved[part.name])

    # -------------------------------------------------------------- between members

    def send(self, cohort: Cohort) -> None:
        """Rank 0 hands the joiners of the new generation the live state."""
        broadcast_object(self.capture() if cohort.rank == 0 else None, cohort.group,
                         device=cohort.device, timeout=STATE_TIMEOUT)

    def receive(self, cohort: Cohort) -> None:
        """A joiner takes the cohort's live state (sent by ``send``). If it does not
        arrive (a member was lost during the broadcast), the joiner goes back to the
        join queue and takes it at a later boundary, ``REJOINS`` times at most."""
        for tries in range(REJOINS + 1):
            try:
                state = broadcast_object(None, cohort.group, device=cohort.device,
                                         timeout=STATE_TIMEOUT)
                break
            except PeerLostError as exc:
                if tries == REJOINS:
                    raise RendezvousError(
                        f"[rank {cohort.rank}] admitted {REJOINS + 1} times, but the live "
                        f"state never arrived ({exc}); the cohort went on without this "
                        "worker: start it again to rejoin (and build the model and "
                        "optimizer before joining, so joining is quick)") from exc
                log.warning("[rank %d] admitted, but the live state did not arrive (%s): "
                            "back to the join queue", cohort.rank, exc)
                cohort.rejoin("the live state did not arrive")
        try:
            compare_settings(self._settings, state.get("settings"), cohort.rank)
        except ConfigError:
            cohort.leave()  # the members form the next generation without it at once
            raise
        self.apply(state)
        log.warning("[rank %d] joined at step %d with the cohort's live state", cohort.rank,
                    self._progress.steps)

    def realign(self, cohort: Cohort) -> bool:
        """Members of a new generation may be one step apart: a peer that died after
        some members had finished the step's last collective (they committed) but before
        others had (they abandoned). The most advanced member's state wins. Returns
        whether the members were apart (False: nothing changed)."""
        steps = torch.tensor([self._progress.steps], dtype=torch.int64, device=cohort.device)
        counts = [int(t.item()) for t in allgather_tensor(steps, cohort.group)]
        if len(set(counts)) == 1:
            return False
        source = counts.index(max(counts))
        state = broadcast_object(self.capture() if cohort.rank == source else None,
                                 cohort.group, src=source, device=cohort.device)
        if cohort.rank != source:
            self.apply(state)
        log.warning("[rank %d] members were at steps %s after recovery; all take step %d",
                    cohort.rank, counts, max(counts))
        return True

    # ------------------------------------------------------------------ on disk

    def save(self, cohort: Cohort, directory: Path) -> str | None:
        """Rank 0 writes the live state; returns the file's path there (None elsewhere)."""
        manager = CheckpointManager(directory, rank=cohort.rank)
        saved = manager.save(self._progress.steps, self.capture()).path
        return None if saved is None else str(saved)

    def resume(self, cohort: Cohort, directory: Path) -> bool:
        """Every member starts from the newest checkpoint in ``directory``, as rank 0
        reads it; False (and nothing changed) if there is none."""
        checkpoint, missing = None, not directory.is_dir()
        if cohort.rank == 0 and not missing:  # (a manager would create a missing one)
            checkpoint = CheckpointManager(directory, rank=0).load_latest()
        found = broadcast_object((checkpoint.state, str(checkpoint.path)) if checkpoint
                                 else None, cohort.group, device=cohort.device)
        if found is None:  # said once, by rank 0: a mistyped directory must not pass quietly
            if cohort.rank == 0:
                log.warning("resume=True, but there is no checkpoint in %s (%s): starting "
                            "from step 0", directory,
                            "no such directory" if missing else "the directory is empty")
            return False
        state, path = found
        self.apply(state, f"the checkpoint {path}")
        log.warning("[rank %d] resumed at step %d from %s", cohort.rank,
                    self._progress.steps, directory)
        return True


def _check_state(state: Any, source: str) -> None:
    """``state`` is a live state (``capture``'s), or a clear error naming ``source``
    instead of a raw ``KeyError``."""
    entries = sorted(state) if isinstance(state, dict) else type(state).__name__
    if not isinstance(state, dict) or not set(state) >= LIVE_KEYS:
        raise ConfigError(
            f"{source} is not a live state potluck.prepare wrote (it holds {entries}; a "
            f"live state holds {sorted(LIVE_KEYS)}): prepare(resume=True) reads the "
            "checkpoints prepare's own jobs save (opt.state_dict() as a whole, under "
            "CheckpointManager); load another file yourself, or point checkpoint_dir= "
            "at the right directory")


def _check_optimizer(optimizer: torch.optim.Optimizer, source: str) -> None:
    """After loading: every param group has every setting of this optimizer's class
    (a state saved by another class lacks some, and the first step would fail inside
    torch; a setting a newer torch added is filled in by the class as it loads)."""
    for k, group in enumerate(optimizer.param_groups):
        missing = sorted(set(optimizer.defaults) - set(group))
        if missing:
            raise ConfigError(
                f"{source} was saved by another optimizer than this "
                f"{type(optimizer).__name__}: its param group {k} lacks {missing}; resume "
                "with the optimizer class it was saved with")


LIVE_KEYS = frozenset({"model", "optimizer", "cursor", "steps", "bucket_order"})


def _on_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _on_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_on_cpu(v) for v in obj)
    return obj


def compare_settings(mine: Mapping[str, int | str] | None,
                     theirs: Mapping[str, int | str] | None, rank: int) -> None:
    """A joiner's ``prepare`` settings (``mine``) must be the cohort's (``theirs``), its
    potluck among them (``protocol.running``): with another sync, trust,
    balance or DataParallel option it would run other collectives than the members
    (a hang or garbage), with another clip or weighting it would train otherwise. The
    seed may differ (the live state's data order is kept: ``apply`` says so). Raised
    after the live state arrived, so the members are not kept waiting for it, and
    the joiner announces that it leaves: they go on without it."""
    if theirs is None or mine is None:
        return  # (a sender from before settings travelled: nothing to compare)
    differ = [name for name in sorted(set(mine) | set(theirs))
              if name != "seed" and mine.get(name) != theirs.get(name)]
    if not differ:
        return
    table = "; ".join(f"{name}: the cohort's {theirs.get(name)!s}, this worker's "
                      f"{mine.get(name)!s}" for name in differ)
    if "potluck" in differ:
        raise ConfigError(f"[rank {rank}] this joiner runs another potluck than the "
                          f"cohort it joined ({table}); {FIX} (the cohort goes on "
                          "without it)")
    raise ConfigError(
        f"[rank {rank}] this joiner called prepare() with other settings than the "
        f"cohort it joined ({table}); every worker must pass the same dataset, "
        "global_batch, drop_last, sync, balance, trust, clip_grad_norm and DataParallel "
        "options, or it would not sync alike with the others. Start it with the same "
        "script and arguments as the running workers (the cohort goes on without it)")
