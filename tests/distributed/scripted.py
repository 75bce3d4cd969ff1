"""A share policy for tests: shares that change on a script (the seam a balancer uses)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ScriptedShares:
    """Plan ``k`` for committed steps ``[k * every, (k + 1) * every)``, cycling; each
    plan is cut to the cohort's size."""

    name = "shares"

    def __init__(self, plans: Sequence[Sequence[float]], every: int) -> None:
        self.plans, self.every, self.steps = [list(p) for p in plans], every, 0

    def shares(self, world_size: int) -> list[float]:
        return self.plans[(self.steps // self.every) % len(self.plans)][:world_size]

    def on_commit(self, steps: int) -> None:
        self.steps = steps

    def on_membership(self, rank: int, world_size: int) -> None:
        """Fixed cohort: never called."""

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = state["steps"]
