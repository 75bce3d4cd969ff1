"""``StepTransaction``: one global step, committed or redone; the optimizer a user holds.

``step()`` is the commit point. A step whose collectives all succeeded is applied (by
the ``GuardedOptimizer``: clip, agreed non-finite skip), the data cursor advances, every
step part hears ``on_commit``, and the boundary runs (leave, admission, minimum size).
A step whose collectives failed on an elastic cohort is neither applied nor committed:
the cohort forms the next generation without the lost peer (the one ``GroupHandle``
everybody holds now talks on the new group), the members realign to the most advanced
one, the parts hear ``on_membership``, and the loader hands out the same slice again,
split among the survivors. On a fixed cohort a failure raises ``PeerLostError``.

Under a sync strategy (DiLoCo) a step of the loop is a local step and the cursor's step
is a round. A member lost mid-round fails the round's sync: the survivors recover the
same way, then sync again among themselves and commit the round without the lost
member's part, which the cursor owes (hands out again) so that every sample reaches
the global model exactly once. (Under Streaming DiLoCo, whose earlier fragments were
applied mid-round, the strategy voids the round instead: it is trained again.)

The transaction is built of parts, each in its own module: ``live_state`` (capture,
send, receive, realign, save, resume), ``boundary`` (vote, admission, leave, minimum)
and the extension parts (``parts.StepPart``: a share policy today; sync strategies and
aggregation policies next).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from potluck.cohort import Cohort
from potluck.data import DataCursor
from potluck.errors import (
    ConfigError,
    CursorError,
    PeerLostError,
    QuarantinedError,
    ReducerError,
)
from potluck.metrics.observer import StepObserver
from potluck.reducer import DataParallel
from potluck.step.boundary import Boundary
from potluck.step.guard import GuardedOptimizer, StepResult
from potluck.step.live_state import LiveState, Progress
from potluck.step.minimum import MinimumSize
from potluck.step.parts import BeforeUpdate, Gatekeeper, StepPart, Steward, SyncStrategy

DEFAULT_CHECKPOINT_DIR = "potluck-checkpoints"

log = logging.getLogger(__name__)

P = TypeVar("P")


class StepTransaction:
    """Call ``zero_grad()`` and ``step()`` as with any optimizer; ``.optimizer`` is the
    torch optimizer (for LR schedulers)."""

    def __init__(self, optimizer: GuardedOptimizer, model: DataParallel, cohort: Cohort,
                 cursor: DataCursor, *, parts: tuple[StepPart, ...] = (),
                 minimum: MinimumSize | None = None, admit_every: int = 1,
                 checkpoint_dir: str | Path | None = None, resume: bool = False,
                 observer: StepObserver | None = None,
                 handed: Callable[[], int] | None = None,
                 settings: Mapping[str, int | str] | None = None) -> None:
        """``minimum`` defaults to the launcher's (``potluck run --min-workers``);
        ``resume`` starts the founders from the newest checkpoint in ``checkpoint_dir``
        (written when the cohort stopped below its minimum), if there is one;
        ``observer`` times each step (``potluck.metrics.observer``); ``handed``: the
        batches the loader has handed out so far (``StepLoader.batches``), so that a
        second ``step()`` for one batch is refused instead of skipping the next one;
        ``settings``: what the founders agreed on in ``prepare`` (``signature``), which a
        joiner's own must equal (``LiveState.receive``)."""
        self.guarded, self.model, self.cohort, self.cursor = optimizer, model, cohort, cursor
        optimizer.alias(self)  # the loop's optimizer: a GradScaler used on it is refused
        self._handed, self._handed_at_step = handed, 0
        self._pass_at_step = model.reducer.last_pass
        self._params = list(model.module.parameters())  # whose requires_grad is synced
        self._trainable = [p.requires_grad for p in self._params]
        self.parts = parts
        self.observer = observer
        if observer is not None:  # (a resume's notes too); finish() closes it
            observer.hear_notes()
        try:
            # Replicas reconciled once a round (DiLoCo) instead of every step's gradients.
            self._sync = next((p for p in parts if isinstance(p, SyncStrategy)), None)
            # Parts that can remove a member (trust), looked up once: not every step.
            self._gatekeepers = tuple(p for p in parts if isinstance(p, Gatekeeper))
            # Parts that let a member go cleanly (a swap for a spare).
            self._stewards = tuple(p for p in parts if isinstance(p, Steward))
            # Parts that act before the update (trust's spot-check copy): not under a
            # sync strategy, whose steps' gradients are local.
            self._before_update = () if self._sync is not None else tuple(
                p for p in parts if isinstance(p, BeforeUpdate))
            self.progress = Progress()
            self._hold_at_boundary = False
            self.live_state = LiveState(model, optimizer, cursor, self.progress, parts,
                                        settings)
            minimum = minimum or MinimumSize(cohort.env.min_workers, cohort.env.min_workers_timeout)
            if not cohort.elastic and minimum.workers > cohort.world_size:
                raise ConfigError(
                    f"minimum={minimum.workers} workers, but this fixed job has "
                    f"{cohort.world_size} and can never grow: lower it, or run elastic "
                    "(potluck run --elastic --min-workers N), where joiners can come"
                )
            self.boundary = Boundary(cohort, self.live_state, self.progress, minimum,
                                     Path(checkpoint_dir or DEFAULT_CHECKPOINT_DIR),
                                     admit_every=admit_every, changed=self._tell_parts)
            if cohort.joined_late:
                self.live_state.receive(cohort)
                self._tell_parts()
            elif resume:
                self.live_state.resume(cohort, self.boundary.checkpoint_dir)
            self.boundary.hold_minimum()
        except BaseException:
            if observer is not None:
                observer.close()  # never a listener left behind by a failed setup
            raise

    # ------------------------------------------------------------ optimizer surface

    @property
    def optimizer(self) -> Any:
        """The torch optimizer: give it to LR schedulers (``StepLR(opt.optimizer, ...)``;
        torch's schedulers take an ``Optimizer`` only, and this is not one on purpose:
        code that takes an ``Optimizer`` may read its ``state_dict()`` as torch's)."""
        return self.guarded.optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.guarded.param_groups

    @property
    def state(self) -> Any:
        """The torch optimizer's per-parameter state (momentum buffers, Adam's moments)."""
        return self.guarded.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:
        return self.guarded.optimizer.defaults  # type: ignore[no-any-return]

    def add_param_group(self, group: dict[str, Any]) -> None:
        raise ConfigError(
            "add_param_group() after prepare(): the model's gradients are synced for the "
            "parameters it had when it was set up, so a group added now could hold "
            "parameters nobody averages; build the optimizer with every parameter group "
            "before prepare() (set lr=0 on a group to train it later)")

    @property
    def steps(self) -> int:
        """Committed global steps (the same on every member); under a sync strategy,
        committed rounds. A round that lost a member mid-round counts once the part the
        member took with it is trained again, so a loop that stops after K trained K
        steps' (rounds') samples. Then the same count may be seen twice in a row (a
        loop that saves when ``opt.steps % N == 0`` saves twice); the parts, the
        observer and the checkpoints count every commit."""
        return self.progress.whole

    @property
    def redone(self) -> int:
        """Steps this worker abandoned and redid after a membership change."""
        return self.progress.redone

    @property
    def waited_s(self) -> float:
        """Seconds spent below the minimum size, waiting for joiners."""
        return self.boundary.waited_s

    @property
    def left(self) -> bool:
        """This worker left the cohort (``request_leave``): stop training. The loader
        hands it no more batches; code after the loop still runs, so guard the run's
        result (a final save, a report) with ``if opt.finish():`` or ``not opt.left``."""
        return self.boundary.left

    def part(self, kind: type[P]) -> P | None:
        """The step part of type ``kind`` this transaction runs, if any (e.g.
        ``opt.part(potluck.balance.Balancer)`` for its ``speeds`` and ``plan``)."""
        return next((part for part in self.parts if isinstance(part, kind)), None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.guarded.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The whole live state (model, optimizer, cursor, steps, parts)."""
        return self.live_state.capture()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.live_state.apply(state)

    # ------------------------------------------------------------------- the step

    def report(self, **figures: float) -> None:
        """Figures of the step in progress that only the script knows, for the status
        page, the ``rank_step`` journal and ``potluck plot``: ``opt.report(loss=...)``
        (a float: ``loss.item()``)."""
        if self.observer is not None:
            self.observer.report(**figures)

    def step(self, closure: Any = None) -> StepResult:
        if closure is not None:
            raise ConfigError(
                "step(closure): the step transaction takes no closure; it applies one "
                "synchronized backward per step, so an optimizer that evaluates the loss "
                "several times per step (LBFGS) cannot run under it. Call backward() "
                "yourself, then opt.step()")
        self._check_loop()
        observer = self.observer
        if observer is not None:
            observer.step_started()
        if self.model.step_failed:  # a collective of backward failed: never apply it
            self.guarded.forget_unscale()  # (a loop that unscaled by hand)
            result = StepResult(committed=False, grad_norm=float("nan"), failed=True)
        else:
            for early in self._before_update:
                early.before_update(self.progress.steps + 1)
            result = self.guarded.step()
        if result.failed:
            if observer is not None:
                observer.abandoned()
            self._redo()
            return result
        lost: tuple[tuple[int, int], ...] = ()
        if self._sync is not None:
            if not self._sync.after_inner_step():
                if observer is not None:  # a local step of the round: it commits at its end
                    observer.committed(last=self.model.reducer.last_pass)
                return result
            started = time.perf_counter()
            synced = self._synchronize()
            if observer is not None:
                observer.blocked("the round's sync", time.perf_counter() - started)
            if synced is None:  # the round starts again from the committed state
                return self._round_again(result)
            if observer is not None:
                observer.committed(last=self.model.reducer.last_pass)
            lost = synced
        elif observer is not None:
            observer.committed(self.progress.steps, self.model.reducer.last_pass)
        self.cursor.commit(lost)  # committed, or skipped for a non-finite gradient: done
        self.progress.steps += 1
        self.cohort.committed()  # (this generation trained: a quorum counts from it)
        if self.cursor.state.owed:  # part of a round is still to train: not whole yet
            self.progress.partial += 1
        for part in self.parts:
            part.on_commit(self.progress.steps)
        quarantined = self._remove_quarantined()
        self._let_go()
        self.boundary.after_commit(expel=quarantined is not None)
        if quarantined:
            raise QuarantinedError(
                f"this worker ({self.cohort.worker_id}) was quarantined by the cohort after "
                f"step {self.progress.steps}: {quarantined}; it left the cohort and will "
                "not be readmitted (docs/trust.md)")
        if self._hold_at_boundary:  # a recovery inside a round's sync: hold here, where
            self._hold_at_boundary = False  # the live state is a committed one
            self.boundary.hold_minimum()
        return result

    def _check_loop(self) -> None:
        """Refuse a ``step()`` the loop did not earn, before it issues a collective: a
        second one for the same batch would commit the cursor again (the next batch
        skipped, the stale gradient applied twice), and one without a synchronized
        backward on this rank would pair its collectives with the other ranks' backward
        ones (a vote read as a gradient bucket)."""
        if [p.requires_grad for p in self._params] != self._trainable:
            was = {id(p): flag for p, flag in zip(self._params, self._trainable, strict=True)}
            changed = sorted(name for name, p in self.model.module.named_parameters()
                             if was.get(id(p)) != p.requires_grad)
            raise ConfigError(
                f"parameter(s) {changed[:5]} changed requires_grad after prepare(): potluck "
                "syncs the parameters that required a gradient when it was set up, so one "
                "unfrozen since would train apart on every worker (and one frozen since "
                "would still be stepped); set requires_grad before prepare(), or prepare "
                "the model again after changing it")
        handed = self._handed() if self._handed is not None else 0
        if handed and handed == self._handed_at_step:
            raise CursorError(
                f"step() was called again at step {self.progress.steps} without a new batch "
                "from the loader since the last step(): call it once per batch (a second "
                "call would commit the data cursor again, so the next batch would never be "
                "trained on)")
        self._handed_at_step = handed
        model, passed = self.model, self.model.reducer.last_pass
        if (self._sync is None and self.cohort.world_size > 1 and not model.step_failed
                and model.require_backward_grad_sync and passed is self._pass_at_step):
            raise ReducerError(
                f"step() at step {self.progress.steps} on rank {self.cohort.rank} without a "
                "synchronized backward() since the last step(): every worker must run "
                "backward() on its batch every step (the others' gradient all-reduce would "
                "be paired with this worker's next collective); call loss.backward() before "
                "step(), outside model.no_sync() for the last micro-batch")
        self._pass_at_step = passed

    def _round_again(self, result: StepResult) -> StepResult:
        """The round was abandoned on every member: redone, from the committed state,
        which is a boundary (a minimum size waits here)."""
        self.progress.redone += 1
        if self.observer is not None:
            self.observer.abandoned()
        if self._hold_at_boundary:
            self._hold_at_boundary = False
            self.boundary.hold_minimum()
        return StepResult(committed=False, grad_norm=result.grad_norm, failed=True)

    def _remove_quarantined(self) -> str | None:
        """Members a gatekeeper part (trust) quarantined in this step: on an elastic
        cohort they are removed at this boundary and their seats banned. None if nobody;
        else why this worker itself must go ('' if it stays)."""
        removed = [r for part in self._gatekeepers for r in part.removals()]
        if not removed or not self.cohort.elastic:
            return None
        mine = ""
        for member, why in removed:
            self.cohort.expel(member, why)
            if member == self.cohort.worker_id:
                mine = why
        if mine:
            self.boundary.request_leave()
        return mine

    def _let_go(self) -> None:
        """A steward part (a swap) named this worker: it leaves at this boundary."""
        for member, why in (d for part in self._stewards for d in part.departures()):
            if member == self.cohort.worker_id and self.cohort.elastic:
                log.warning("[rank %d] leaving the cohort: %s", self.cohort.rank, why)
                self.boundary.request_leave()

    def _redo(self) -> None:
        self.progress.redone += 1
        log.warning("[rank %d] step %d not applied: a collective failed; redoing it",
                    self.cohort.rank, self.progress.steps)
        self._recover("a collective of the step failed")

    def _recover(self, why: str) -> None:
        if self.observer is not None:
            self.observer.moving("recovering from a lost peer, before step {step}")
        self.cohort.mark_step_failed()
        self.cohort.recover(why)
        self.live_state.realign(self.cohort)
        self._tell_parts()
        self.boundary.hold_minimum()

    def _synchronize(self) -> tuple[tuple[int, int], ...] | None:
        """The round's sync; the positions of its block that did not reach the global
        model. A member lost mid-round fails it before anything changed here: on an
        elastic cohort the survivors form the next generation and sync again, weighted
        among themselves (their replicas are still their round's work). None: the
        members were a round apart (a peer died after some had finished the previous
        round's sync): realign gave everyone the most advanced member's committed state
        and the round starts again from it, split among the new members; or the members
        had split the round differently and every one abandoned it (the strategy's
        None)."""
        assert self._sync is not None
        while True:
            try:
                return self._sync.synchronize()
            except PeerLostError:
                if not self.cohort.elastic:
                    raise
                log.warning("[rank %d] round %d: a member was lost in it; the survivors sync "
                            "again among themselves", self.cohort.rank, self.progress.steps + 1)
                # No minimum hold (and so no admission) here: mid-round, the live state
                # is no committed one. It waits for the round's boundary.
                self.cohort.mark_step_failed()
                self.cohort.recover("a collective of the round's sync failed")
                apart = self.live_state.realign(self.cohort)
                self._tell_parts()
                self._hold_at_boundary = True
                if apart:
                    self._sync.abandon_round()
                    return None

    def _tell_parts(self) -> None:
        """The membership changed (no collective here: every caller is at a different
        point of the protocol)."""
        for part in self.parts:
            part.on_membership(self.cohort.rank, self.cohort.world_size)

    # ------------------------------------------------------------------- leaving

    def request_leave(self) -> None:
        """Leave at the next step boundary (e.g. from a SIGTERM handler)."""
        self.boundary.request_leave()

    def leave_on_sigterm(self) -> None:
        """SIGTERM (the owner wants the GPU back) finishes the step, then leaves. Only an
        elastic cohort can go on without a worker: a fixed job keeps SIGTERM's default
        (the launcher stops everyone)."""
        if self.cohort.elastic:
            signal.signal(signal.SIGTERM, lambda signum, frame: self.request_leave())

    def finish(self) -> bool:
        """The run is over for this worker: tell any joiner still waiting (unless this
        worker left alone), then release the cohort. True when this worker trained with
        the cohort to the end; False when it left (``request_leave``, SIGTERM under
        ``leave_on_sigterm``): the others train on, and this model stopped where it left.
        Save or report the run's result under ``if opt.finish():``."""
        if self.observer is not None:
            self.observer.close()
        sync = self._sync
        unsynced = sync.unsynced() if sync is not None else 0
        if sync is not None and unsynced:  # the replicas differ: back to the global ones
            log.warning("[rank %d] finish() with %d local step(s) of a round not synced: "
                        "they are dropped, and the model is back at the global parameters "
                        "of the last sync, which every worker holds; to keep them, end the "
                        "loop at the end of a round (with the loader, or on opt.steps)",
                        self.cohort.rank, unsynced)
            sync.abandon_round()
        if self.left:
            self.cohort.close()
        else:
            self.cohort.finish()
        return not self.left

