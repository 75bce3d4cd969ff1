"""``SwapPart``: the step part that keeps the cohort's population healthy.

It hears each committed step's figures from the step observer (a ``StepSink``): this
member's compute per sample and the step's wall time. Each member probes its link
(``probe``) once every ``rule.every`` steps, each at its own step. Every ``rule.every``
steps of a generation all members check together: one all-gather shares every
member's figures and rank 0's count of waiting spares, and every member reaches the
same verdict from the same numbers: the window's checks weighed together
(``swap.check``), from the generation's first full window on. A decision names one
member: it leaves at this step's boundary as in a planned leave (``departures``), and
the boundary admits a spare in the same new generation. Rank 0 notes the decision
(``potluck.events``: the status page and the ``rank_step`` journal).
A lost peer during the check skips it: the next step recovers.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from typing import Any

import torch

from potluck import events
from potluck.cohort import Cohort
from potluck.collectives import allgather_tensor
from potluck.errors import ConfigError, PeerLostError
from potluck.events import Note
from potluck.metrics.observer import StepFigures
from potluck.population.probe import LinkProbe
from potluck.population.swap import (
    CheckInput,
    MemberCost,
    SwapDecision,
    SwapRule,
    check,
    decide,
)

log = logging.getLogger(__name__)


class SwapPart:
    """A step part and a step observer's sink; ``departures()`` names who leaves now."""

    name = "swap"

    def __init__(self, rule: SwapRule, cohort: Cohort, probe: LinkProbe, *,
                 global_batch: int, balanced: bool = False) -> None:
        self.rule, self._cohort, self._probe = rule, cohort, probe
        self._batch, self._balanced = global_batch, balanced
        self._steps = 0  # committed steps, as every member counts them
        self._since = 0  # the step the current generation's checks count from
        # (each step's figures over the window; each check's members over the window)
        self._figures: deque[tuple[float, float]] = deque(maxlen=rule.every * rule.checks)
        self._rows: deque[list[MemberCost]] = deque(maxlen=rule.checks)
        self._protected: dict[str, int] = {}  # came in by a swap -> until step
        self._leaving: list[tuple[str, str]] = []
        self._swapped = False  # a swap at this boundary: protect who joins
        self._own_s = 0.0  # time this part took after the last step (not the step's)
        self._link = float("nan")  # this member's last probe, this generation
        self.decisions: list[SwapDecision] = []

    # ------------------------------------------------------------ the observer's sink

    def write(self, figures: StepFigures) -> None:
        step_s = figures.step_s
        if figures.compute_s and figures.samples and step_s:
            step_s = max(step_s - self._own_s, 1e-9)
            self._figures.append((figures.compute_s / figures.samples, step_s))
        self._own_s = 0.0

    def note(self, note: Note) -> None:
        """Notes are not figures: nothing to keep."""

    def close(self) -> None:
        """Nothing held open."""

    # --------------------------------------------------------------- the step part

    def on_commit(self, steps: int) -> None:
        self._steps, self._leaving = steps, []
        counted = steps - self._since
        every = self.rule.every
        started = time.perf_counter()
        try:
            # Each member probes once between checks, at its own step (rank mod every):
            # probes at once would queue on the store host's link, and the later one
            # would read that link's queue as its own (a steady 2x, seen in the bench).
            if counted >= 1 and steps % every == self._cohort.rank % every:
                self._link = self._probe()
            # (a generation's checks all see the same members at work: its first window
            # of them only gathers figures)
            if counted >= every and counted % every == 0:
                self._check(steps)
        finally:
            self._own_s = time.perf_counter() - started

    def departures(self) -> list[tuple[str, str]]:
        """(member, why) that leave at this step's boundary."""
        return list(self._leaving)

    def on_membership(self, rank: int, world_size: int) -> None:
        if self._swapped:
            for joined in self._cohort.membership.joined:
                self._protected[joined] = self._steps + self.rule.protect
            self._swapped = False
        self._since, self._link = self._steps, float("nan")
        self._figures.clear()
        self._rows.clear()

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self._steps, "since": self._since,
                "protected": dict(self._protected), "rule": [self.rule.drag, self.rule.window]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("rule") != [self.rule.drag, self.rule.window]:
            raise ConfigError(
                f"the live state was made with swap rule {state.get('rule')} (drag, "
                f"window), this worker has [{self.rule.drag}, {self.rule.window}]: start "
                "every worker with the same --swap-drag and --swap-window")
        self._steps, self._since = int(state["steps"]), int(state["since"])
        self._protected = {str(k): int(v) for k, v in state["protected"].items()}

    # ------------------------------------------------------------------- the check

    def _check(self, steps: int) -> None:
        cohort = self._cohort
        figures = list(self._figures)
        mine = figures[-self.rule.every:]
        compute = statistics.median(c for c, _ in mine) if mine else float("nan")
        step_s = statistics.median(s for _, s in figures) if figures else float("nan")
        spares = cohort.spares() if cohort.rank == 0 else 0
        row = torch.tensor([compute, self._link, step_s, float(spares)],
                           dtype=torch.float64)
        try:
            rows = allgather_tensor(row, cohort.group)
        except PeerLostError:
            cohort.mark_step_failed()  # the next step recovers
            return
        values = [r.tolist() for r in rows]
        if any(v != v for r in values for v in r[:3]):  # a member without figures: skip
            return
        members = cohort.membership.members
        self._rows.append([MemberCost(m, r[0], r[1])
                           for m, r in zip(members, values, strict=True)])
        self._protected = {m: s for m, s in self._protected.items() if s > steps}
        data = CheckInput(steps, list(self._rows), values[0][2], self._batch,
                          int(values[0][3]), self._balanced, frozenset(self._protected))
        verdict = check(self.rule, data)
        log.info("[rank %d] swap check after step %d: %s; members (ms a sample, Mbit/s): "
                 "%s", cohort.rank, steps, verdict,
                 [(round(m.compute_s_per_sample * 1e3, 3),
                   round(8e-6 / max(m.link_s_per_byte, 1e-18), 1)) for m in self._rows[-1]])
        decision = decide(self.rule, verdict)
        if decision is None:
            return
        self.decisions.append(decision)
        self._leaving, self._swapped = [(decision.member, decision.text())], True
        log.warning("[rank %d] %s", cohort.rank, decision.text())
        if cohort.rank == 0:
            events.note("swap", decision.text(), step=steps, member=decision.member)
