"""The cursor's state and its transitions, as a pure value.

``CursorState`` says where an epoch stands: the next global step consumes
``perm[cursor : cursor + global_batch]`` of epoch ``epoch``'s permutation (shorter at the
end of the epoch when ``drop_last`` is False). ``advanced()`` is the commit transition,
rolling over to the next epoch after the last step. The state is a handful of ints and
round-trips through ``to_dict``/``load`` (what a checkpoint stores).

**Owed ranges.** A step can commit without all of its block: under a sync strategy a
worker lost mid-round takes its part of the round with it, and the survivors commit
theirs (``advanced(lost=...)``). The lost positions are *owed*: each owed range is a
step of its own, served before the cursor moves on (and before the epoch rolls over), so
every sample still reaches the model exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from potluck.errors import ConfigError

_CONFIG_KEYS = ("dataset_len", "global_batch", "drop_last")
_STATE_KEYS = ("epoch", "cursor", "seed")

Range = tuple[int, int]  # [start, stop) positions in the epoch permutation


def _check_int(name: str, value: object, minimum: int, fix: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name}={value!r} is invalid: it must be an integer >= {minimum}. {fix}")


@dataclass(frozen=True)
class CursorState:
    """Where the data stands: configuration (first three fields) plus position."""

    dataset_len: int
    global_batch: int
    drop_last: bool = False
    seed: int = 0
    epoch: int = 0
    cursor: int = 0
    owed: tuple[Range, ...] = ()  # lost parts of committed steps, served next, in order

    def __post_init__(self) -> None:
        _check_int("dataset_len", self.dataset_len, 1, "Pass len(dataset); it cannot be empty.")
        _check_int("global_batch", self.global_batch, 1,
                   "It is the number of samples all ranks together train on per step.")
        _check_int("seed", self.seed, 0, "Use a non-negative seed.")
        _check_int("epoch", self.epoch, 0, "Epochs count from 0.")
        if self.drop_last and self.global_batch > self.dataset_len:
            raise ConfigError(
                f"global_batch={self.global_batch} > dataset_len={self.dataset_len} with "
                "drop_last=True would drop every sample: lower global_batch or set "
                "drop_last=False (one short step per epoch)."
            )
        # The cursor may sit at the epoch's end only while owed ranges are left.
        end = self.epoch_end + (1 if self.owed else 0)
        if (not isinstance(self.cursor, int) or isinstance(self.cursor, bool)
                or not 0 <= self.cursor < end):
            raise ConfigError(
                f"cursor={self.cursor!r} is invalid: it must be an integer in "
                f"[0, {end}) for dataset_len={self.dataset_len}, "
                f"global_batch={self.global_batch}, drop_last={self.drop_last}."
            )
        for start, stop in self.owed:
            if not 0 <= start < stop <= self.epoch_end:
                raise ConfigError(
                    f"owed range [{start}, {stop}) is invalid: owed ranges are non-empty "
                    f"positions within the epoch's [0, {self.epoch_end})")

    @property
    def epoch_end(self) -> int:
        """How many samples of the permutation an epoch uses (all but a dropped tail)."""
        if self.drop_last:
            return self.dataset_len - self.dataset_len % self.global_batch
        return self.dataset_len

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.epoch_end // self.global_batch)

    @property
    def steps_left(self) -> int:
        """Steps of the current epoch not yet committed (including the current one):
        the owed ones, then the rest of the permutation."""
        return len(self.owed) + -(-(self.epoch_end - self.cursor) // self.global_batch)

    @property
    def block(self) -> Range:
        """``[start, stop)`` positions in the epoch permutation that this step consumes:
        the first owed range if there is one."""
        if self.owed:
            return self.owed[0]
        return self.cursor, min(self.cursor + self.global_batch, self.epoch_end)

    def advanced(self, lost: tuple[Range, ...] = ()) -> CursorState:
        """The state after this step commits; the last step of an epoch rolls over.
        ``lost``: positions of this step's block that did not reach the model (they are
        owed, after any owed before them)."""
        start, stop = self.block
        for a, b in lost:
            if not start <= a < b <= stop:
                raise ConfigError(f"lost range [{a}, {b}) is not within the step's block "
                                  f"[{start}, {stop}): only a part of the step can be lost")
        owed, cursor = (self.owed[1:], self.cursor) if self.owed else ((), stop)
        owed += tuple(lost)
        if cursor >= self.epoch_end and not owed:
            return replace(self, epoch=self.epoch + 1, cursor=0, owed=())
        return replace(self, cursor=cursor, owed=owed)

    def rest_of_epoch(self) -> Iterator[CursorState]:
        """This state and every later one of the same epoch, one per step."""
        state = self
        for _ in range(self.steps_left):
            yield state
            state = state.advanced()

    def to_dict(self) -> dict[str, Any]:
        return {"dataset_len": self.dataset_len, "global_batch": self.global_batch,
                "drop_last": int(self.drop_last), "seed": self.seed, "epoch": self.epoch,
                "cursor": self.cursor, "owed": [list(r) for r in self.owed]}

    def load(self, saved: Mapping[str, Any]) -> CursorState:
        """The saved position on this configuration; a different configuration is an error."""
        missing = [k for k in _CONFIG_KEYS + _STATE_KEYS if k not in saved]
        if missing:
            raise ConfigError(
                f"cursor state is missing {missing}: it must come from "
                "DataCursor.state_dict() (keys: " + ", ".join(_CONFIG_KEYS + _STATE_KEYS) + ")."
            )
        for key in _CONFIG_KEYS:
            if int(saved[key]) != int(getattr(self, key)):
                raise ConfigError(
                    f"cursor state was saved with {key}={saved[key]!r} but this cursor has "
                    f"{key}={getattr(self, key)!r}: resume with the same dataset and "
                    f"settings, or start a fresh cursor."
                )
        owed = tuple((int(a), int(b)) for a, b in saved.get("owed", ()))  # older: none
        return replace(self, seed=saved["seed"], epoch=saved["epoch"], cursor=saved["cursor"],
                       owed=owed)
