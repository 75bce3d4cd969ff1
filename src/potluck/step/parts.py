"""The seams of the step transaction: what a further part (a share policy, a sync
strategy, an aggregation policy) implements to plug in without editing the others.

The transaction (``transaction.py``) calls every part it was given, in order:

- ``on_commit(steps)`` after a step committed (the cursor advanced; ``steps`` committed
  so far): a sync strategy counts its inner steps here, a balancer its measurements;
- ``before_update(steps)``, for a ``BeforeUpdate`` part only, after the synchronized
  backward and before the optimizer applies it;
- ``on_membership(rank, world_size)`` after the membership changed (a loss, a join, a
  leave): a share policy redistributes, a strategy resets what was per-member;
- ``state_dict()`` / ``load_state_dict()``: the part's state travels with the live
  state to a joiner, to a realigned survivor and into checkpoints, under ``name``.

``SharePolicy`` is the part the data loader asks how to split each step's block
(``EqualShares``, the balancer). ``SyncStrategy`` reconciles replicas by their
parameters every round instead of their gradients every step (DiLoCo: ``potluck.sync``).
Where the other kinds plug in is in ``docs/design.md`` ("The step transaction and its
parts").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from potluck.data.split import equal_shares


@runtime_checkable
class StepPart(Protocol):
    """A part of the step transaction."""

    name: str

    def on_commit(self, steps: int) -> None: ...

    def on_membership(self, rank: int, world_size: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class SharePolicy(StepPart, Protocol):
    """How many of each step's samples each rank takes (weights, summing to anything)."""

    def shares(self, world_size: int) -> Sequence[float]: ...


@runtime_checkable
class SyncStrategy(SharePolicy, Protocol):
    """Replicas step locally and are reconciled once a round (``potluck.sync``).

    A step of the cursor is a round. The loader asks ``segments(block)`` (the round's
    block, as ``[start, stop)`` positions of the epoch permutation) in which pieces to
    hand it out, splits each by ``shares`` as they stand when it gets to it, and asks
    ``inner_steps(part, segment)`` how many local steps this rank's part of it takes;
    the transaction calls ``after_inner_step()`` after each local optimizer step and,
    once it says the round is done here, ``synchronize()``, the round's collectives. It
    returns the positions of the block that did not reach the global model (the parts
    of members lost mid-round): the cursor commits the round and owes those; or None
    when the members found they had split the round differently, and every one of them
    abandoned it. A lost peer raises ``PeerLostError`` before anything changed here,
    so on an elastic cohort the survivors call it again in the next generation; if the
    members turn out to be a round apart, ``abandon_round()`` restarts this rank's round
    from the committed state."""

    def segments(self, block: tuple[int, int]) -> Sequence[tuple[int, int]]: ...

    def inner_steps(self, part: tuple[int, int], block: tuple[int, int],
                    counted: int | None = None) -> int: ...

    def after_inner_step(self) -> bool: ...

    def synchronize(self) -> tuple[tuple[int, int], ...] | None: ...

    def abandon_round(self) -> None: ...

    def unsynced(self) -> int:
        """Local steps of the round under way not yet reconciled (0: none)."""
        ...


@runtime_checkable
class Gatekeeper(StepPart, Protocol):
    """A part that can decide a member must go (``potluck.trust``): after its
    ``on_commit`` the transaction takes ``removals()`` (member id, why) and, on an
    elastic cohort, removes them at this step's boundary and bans their seats."""

    def removals(self) -> list[tuple[str, str]]: ...


@runtime_checkable
class Steward(StepPart, Protocol):
    """A part that can let a member go cleanly (``potluck.population``: a swap for a
    waiting spare): after its ``on_commit`` the transaction takes ``departures()``
    (member id, why); the named member leaves at this step's boundary as in a planned
    leave, and nobody is banned."""

    def departures(self) -> list[tuple[str, str]]: ...


@runtime_checkable
class BeforeUpdate(StepPart, Protocol):
    """A part that acts between a step's synchronized backward and the optimizer's update
    (``potluck.trust``: its spot check's copy of the parameters). Called on every step
    the optimizer is about to apply, only without a sync strategy (there a step's
    gradients are local): the parameters are still the ones the gradients were computed
    on; ``steps`` is the count the step commits as."""

    def before_update(self, steps: int) -> None: ...


class EqualShares:
    """Every rank takes the same share (the cursor's largest-remainder split)."""

    name = "shares"

    def shares(self, world_size: int) -> Sequence[float]:
        return equal_shares(world_size)

    def on_commit(self, steps: int) -> None:
        """Equal shares learn nothing from a step."""

    def on_membership(self, rank: int, world_size: int) -> None:
        """Equal for any membership: nothing to redistribute."""

    def state_dict(self) -> dict[str, Any]:
        return {"policy": "equal"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("policy") != "equal":
            from potluck.errors import ConfigError
            raise ConfigError(
                f"the live state was made with share policy {state.get('policy')!r}, but "
                "this worker uses equal shares: every worker of a job must run the same "
                "script with the same potluck.prepare(...) arguments"
            )
