"""``MemoryCap``: the most samples this rank's forward takes at once (pure bookkeeping),
and ``is_out_of_memory``: which errors say that memory ran out.

A rank's part of the step may not fit in its accelerator's memory: a large share on a
small GPU, or any share on a card whose owner starts a game. The part is then taken in
micro-batches of at most ``cap`` samples, with accumulation (``step.fit``). The cap is
the user's (``BalanceConfig(max_micro_batch=...)``), lowered by every out-of-memory
error the rank hits: a micro-batch of ``n`` samples that ran out of memory halves the
cap to ``n // 2``. A size that went through forward and backward is remembered as
known to fit (until one that fitted runs out: then none is); a larger one is tried in
a way that can be retried (``step.fit``).

A found cap stays for the life of the process: memory that was short once (another
process on the card, fragmentation) is taken as short again. It is per worker, not
state of the job: a restarted worker finds its own.
"""

from __future__ import annotations

import torch

from potluck.errors import ConfigError, OutOfMemoryError, PotluckError

_ALLOCATOR_WORDS = ("out of memory", "can't allocate memory", "failed to allocate")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is a device's or the host's allocator running out of memory
    (not one of potluck's own errors that quote one: a lost peer, a refused retry)."""
    if isinstance(error, PotluckError):
        return False
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(w in text for w in _ALLOCATOR_WORDS)


class MemoryCap:
    """This rank's micro-batch cap: the user's (``given``) and what out-of-memory
    errors taught (``found``); ``micro_batches(samples)`` is how many a part takes."""

    def __init__(self, given: int | None = None, *, whole: str | None = None) -> None:
        """``whole``: why a part must be taken in one pass (then no cap is given, and
        running out of memory is an error that says so), or None."""
        if given is not None and (isinstance(given, bool) or not isinstance(given, int)
                                  or given < 1):
            raise ConfigError(f"max_micro_batch={given!r} is invalid: the most samples one "
                              "forward may take on this rank, an integer >= 1 (or None)")
        if given is not None and whole is not None:
            raise ConfigError(f"max_micro_batch={given}: {whole}; drop the cap")
        self.given, self.whole = given, whole
        self.found: int | None = None
        self.fitted = 0  # the largest micro-batch known to fit (went through backward)
        self.errors = 0  # out-of-memory errors caught so far

    @property
    def cap(self) -> int | None:
        """The most samples per forward (None: no limit known)."""
        caps = [c for c in (self.given, self.found) if c is not None]
        return min(caps) if caps else None

    def micro_batches(self, samples: int) -> int:
        """How many micro-batches a part of ``samples`` takes under the cap."""
        cap = self.cap
        return 1 if cap is None else max(1, -(-samples // cap))

    def known_to_fit(self, size: int) -> bool:
        return size <= self.fitted

    def fit(self, size: int) -> None:
        """A micro-batch of ``size`` samples went through forward and backward."""
        self.fitted = max(self.fitted, size)

    def ran_out(self, size: int) -> int:
        """A micro-batch of ``size`` samples ran out of memory: the new cap (half of it).
        Raises ``OutOfMemoryError`` if one sample did."""
        self.errors += 1
        if self.whole is not None:
            raise OutOfMemoryError(
                f"ran out of memory on this rank's part of {size} sample(s), which must be "
                f"taken in one pass: {self.whole}. Give this worker a smaller part (fewer "
                "samples per step, or more workers) or more memory")
        if size <= 1:
            raise OutOfMemoryError(
                "one sample does not fit in this rank's memory (it ran out of memory on a "
                "micro-batch of 1): make the model or the samples smaller (a shorter "
                "sequence, activation checkpointing, mixed precision), or run this "
                "worker on a device with more memory")
        self.found = size // 2 if self.found is None else min(self.found, size // 2)
        if size <= self.fitted:  # memory got shorter: no size is known to fit any more
            self.fitted = 0
        return self.found
