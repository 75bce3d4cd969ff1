"""Typed errors: one class per failure a user must be able to tell apart.

Every message says the bad value, the rule it broke, and how to fix it.
"""

from __future__ import annotations


class PotluckError(RuntimeError):
    """Base class of every error potluck raises on purpose."""


class ConfigError(PotluckError, ValueError):
    """A bad argument or setting, detected before any communication."""


class ModelMismatchError(PotluckError):
    """The ranks of a cohort do not hold the same model (names, shapes, dtypes, order)."""


class ReducerError(PotluckError):
    """The gradient reducer was used in a way it cannot honour (e.g. a double backward)."""


class CommunicationError(PotluckError):
    """A collective failed: a peer died, hung past the timeout, or was cut off."""


class CursorError(PotluckError):
    """The data iterator and the committed cursor disagree (a missed or extra commit)."""


class CheckpointError(PotluckError):
    """A checkpoint is missing, truncated, corrupted, or could not be written."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is truncated or fails its checksum (``load_latest`` skips it)."""
