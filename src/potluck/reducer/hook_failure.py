"""What a communication hook's failure means: a lost peer, or the hook's own error.

A hook's ``RuntimeError`` is ambiguous. The backend raises one when a peer died, froze
or was cut off (Gloo: ``[.../gloo/transport/tcp/pair.cc:553] Connection closed by
peer``; NCCL: a ``DistBackendError``), and an elastic cohort then redoes the step
without that peer. But a hook's own bug (a shape mismatch in its arithmetic, an index
out of range) is a ``RuntimeError`` too, and redoing the step without anyone repeats it
on every attempt: before this module an elastic job redid such a step a hundred times
and then blamed the loop for not calling ``step()``.

The rule (pure): a failure is the backend's when it is one of torch's distributed
errors, or its text names the backend or a connection (``BACKEND_WORDS``; a future's
callback that failed on a backend error quotes it: "Got the following error when
running the callback: RuntimeError: [../gloo/...] Connection closed by peer"), or it is
one of potluck's own communication errors. Anything else a hook raised is the hook's:
``CommHookError``, which no cohort absorbs. The words err towards the backend: a lost
peer taken for a hook's bug would stop an elastic job that could have carried on.
"""

from __future__ import annotations

import torch.distributed as dist

from potluck.errors import CommHookError, CommunicationError, PotluckError

BACKEND_WORDS = ("gloo", "nccl", "processgroup", "process group", "peer", "connection",
                 "socket", "broken pipe", "timed out", "timeout", "aborted",
                 "distbackenderror", "distnetworkerror", "diststoreerror")


def is_backend_failure(error: BaseException) -> bool:
    """Whether ``error`` came from the communication backend (or potluck's waits on it)
    rather than from a hook's own code. Potluck's own errors say by their type (a
    ``CommHookError`` quotes the words "not a lost peer"); the text of others is read
    only before torch's "At:" stack of a failed callback, whose file paths are the
    user's (a script under ``~/nccl-tests/`` is not a lost peer)."""
    if isinstance(error, PotluckError):
        return isinstance(error, CommunicationError)
    if isinstance(error, dist.DistError):
        return True
    text = f"{type(error).__name__}: {error}".split("\n\nAt:", 1)[0].lower()
    return any(word in text for word in BACKEND_WORDS)


def hook_error(hook: str, what: str, error: BaseException, rank: int) -> CommHookError:
    """The error for a hook (named ``hook``) that failed in ``what`` with its own
    ``error`` (``is_backend_failure`` said no)."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    return CommHookError(
        f"the communication hook {hook} failed in {what} on rank {rank} with its own "
        f"error, not a lost peer: {type(error).__name__}: {first}. No collective failed, "
        "so redoing the step would fail the same way; fix the hook (its traceback is "
        "this error's cause)")
