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


class CommHookError(ReducerError):
    """A communication hook failed with its own error (not a lost peer): redoing the
    step would fail the same way, so no cohort absorbs it."""


class OutOfMemoryError(PotluckError):
    """This rank cannot take its part of the step in memory, not even one sample at a
    time, or it ran out after a collective of the pass was issued (which cannot be
    taken back); the message says which and what to do."""


class CommunicationError(PotluckError):
    """A collective failed: a peer died, hung past the timeout, or was cut off."""


class PeerLostError(CommunicationError):
    """A collective of a cohort failed because a peer died, froze or was cut off.

    Carries this rank, the membership generation and the backend's own message, so a
    caller can log it and move the cohort to the next generation.
    """

    def __init__(self, message: str, *, rank: int, generation: int, cause: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.generation = generation
        self.cause = cause

    @classmethod
    def from_failure(cls, what: str, exc: BaseException | str, *, rank: int,
                     generation: int) -> PeerLostError:
        """The error for a collective (``what``) that failed with ``exc``."""
        text = str(exc).strip()
        cause = text.splitlines()[0] if text else type(exc).__name__
        kind = "timed out" if "timed out" in cause.lower() or "timeout" in cause.lower() \
            else "failed"
        return cls(
            f"{what} {kind} on rank {rank} in generation {generation}: a peer died, froze "
            f"or was cut off ({cause}); the step's collectives are void: an elastic "
            "cohort redoes the step without it (potluck run --elastic), a static job must "
            "be restarted (potluck run --max-restarts K)",
            rank=rank, generation=generation, cause=text or cause,
        )


class RendezvousError(CommunicationError):
    """The workers could not meet: the store was unreachable or a peer never joined."""


class StoreLostError(RendezvousError):
    """The connection to the job's store broke: its host (node 0's ``potluck run``, or
    rank 0 without a launcher) was killed or cut off, and no successor took it; or the
    etcd cluster that holds it (``etcd=True``) stopped answering."""

    def __init__(self, where: str, what: str, cause: str,
                 tried: list[str] | None = None, *, moved: bool = False,
                 etcd: bool = False) -> None:
        self.where, self.what, self.cause = where, what, cause
        if etcd:
            super().__init__(
                f"the job's store in etcd at {where} is gone ({what}: {cause}): etcd did "
                "not answer, so this process stops here; check the etcd cluster (etcdctl "
                "endpoint health), then restart the job (its checkpoints resume it)")
            return
        if moved:
            then = "it had just moved there from a lost host, and it is gone too"
        elif tried:
            then = (f"no other node's agent could take the store (tried "
                    f"{', '.join(tried)}: none answered from here)")
        else:
            then = ("no other node's agent can take it (a one-node job, a job without "
                    "`potluck run --elastic`, or the agents' addresses were not known yet)")
        super().__init__(
            f"the job's store at {where} is gone ({what}: {cause}): its host was lost or "
            f"cut off, and {then}, so this worker stops here; restart the job on the hosts "
            "still up (their checkpoints resume it)")


class NoQuorumError(RendezvousError):
    """The survivors of a loss were not a majority of the last generation (a cohort
    across nodes): the others may go on as a cohort of their own, so these stop."""


class AdmissionError(RendezvousError):
    """A worker was refused entry to the cohort: it lacks the job's token or holds another."""


class SeatBannedError(AdmissionError):
    """A worker was refused entry: its seat (host, node rank, local rank) was quarantined
    by the cohort's trust checks. Its launcher does not restart it."""


class JobFinishedError(RendezvousError):
    """A joiner arrived after the run it wanted to join had finished: nothing to do.

    Under ``potluck run`` the worker says so and exits with code 0.
    """


class CursorError(PotluckError):
    """The data iterator and the committed cursor disagree (a missed or extra commit)."""


class LoaderWorkerError(PotluckError):
    """A worker process of the step loader (``prepare(num_workers=K)``) died."""


class CheckpointError(PotluckError):
    """A checkpoint is missing, truncated, corrupted, or could not be written."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is truncated or fails its checksum (``load_latest`` skips it)."""


class BelowMinimumError(PotluckError):
    """The elastic cohort stayed below its minimum size: it checkpointed and stopped.

    Under ``potluck run`` the worker exits with ``EXIT_CODE`` and is not restarted.
    """

    EXIT_CODE = 3

    def __init__(self, message: str, *, checkpoint: str | None) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


class QuarantinedError(PotluckError):
    """This worker was quarantined by the cohort's trust checks (``potluck.trust``): it
    left the cohort, and its seat is refused if it comes back."""


def hint(exc: BaseException) -> str | None:
    """What to do instead, for an error torch raises on one of potluck's objects (the
    worker bootstrap of ``potluck run`` adds it under the traceback); None for others.

    torch's LR schedulers accept only a ``torch.optim.Optimizer``. ``prepare``'s optimizer
    is the step transaction, which is not one on purpose: code that takes an
    ``Optimizer`` may also read its ``state_dict()`` as torch's, and the transaction's
    is the whole live state."""
    if isinstance(exc, TypeError) and str(exc) == "StepTransaction is not an Optimizer":
        return ("potluck: prepare() returns the step transaction, not a torch Optimizer; "
                "give LR schedulers the torch optimizer inside it: StepLR(opt.optimizer, "
                "...) (docs/data-parallel.md)")
    return None
