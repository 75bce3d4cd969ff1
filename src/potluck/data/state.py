"""The cursor's state and its transitions, as a pure value.

``CursorState`` says where an epoch stands: the next global step consumes
``perm[cursor : cursor + global_batch]`` of epoch ``epoch``'s permutation (shorter at the
end of the epoch when ``drop_last`` is False). ``advanced()`` is the commit transition,
rolling over to the next epoch after the last step. The state is a handful of ints and
round-trips through ``to_dict``/``from_dict`` (what a checkpoint stores).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from potluck.errors import ConfigError

_CONFIG_KEYS = ("dataset_len", "global_batch", "drop_last")
_STATE_KEYS = ("epoch", "cursor", "seed")


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
        if (not isinstance(self.cursor, int) or isinstance(self.cursor, bool)
                or not 0 <= self.cursor < self.epoch_end):
            raise ConfigError(
                f"cursor={self.cursor!r} is invalid: it must be an integer in "
                f"[0, {self.epoch_end}) for dataset_len={self.dataset_len}, "
                f"global_batch={self.global_batch}, drop_last={self.drop_last}."
            )

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
        """Steps of the current epoch not yet committed (including the current one)."""
        return -(-(self.epoch_end - self.cursor) // self.global_batch)

    @property
    def block(self) -> tuple[int, int]:
        """``[start, stop)`` positions in the epoch permutation that this step consumes."""
        return self.cursor, min(self.cursor + self.global_batch, self.epoch_end)

    def advanced(self) -> CursorState:
        """The state after this step commits; the last step of an epoch rolls over."""
        nxt = self.block[1]
        if nxt >= self.epoch_end:
            return replace(self, epoch=self.epoch + 1, cursor=0)
        return replace(self, cursor=nxt)

    def rest_of_epoch(self) -> Iterator[CursorState]:
        """This state and every later one of the same epoch, one per step."""
        state = self
        for _ in range(self.steps_left):
            yield state
            state = state.advanced()

    def to_dict(self) -> dict[str, int]:
        return {"dataset_len": self.dataset_len, "global_batch": self.global_batch,
                "drop_last": int(self.drop_last), "seed": self.seed, "epoch": self.epoch,
                "cursor": self.cursor}

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
        return replace(self, seed=saved["seed"], epoch=saved["epoch"], cursor=saved["cursor"])
