"""Admission with a shared secret: challenge-response through the store.

The token never travels. The admitter (the leader of the current generation, or the
founder of generation 0) writes a random nonce for each joiner; the joiner answers with
``HMAC-SHA256(token, challenge + joiner_id)``; the admitter recomputes it with its own
token and compares in constant time. Binding the joiner's id into the MAC means an
answer cannot be replayed for another id, and a fresh nonce per attempt means an old
answer cannot be replayed at all. A refused worker gets a verdict naming why and never
receives a rank. The store itself is trusted: whoever can write it can forge a
verdict, so this guards against stray or misconfigured workers, not a hostile network.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable, Sequence

from torch._C._distributed_c10d import Store

from potluck import keys
from potluck.errors import AdmissionError, ConfigError, SeatBannedError

log = logging.getLogger(__name__)

NO_TOKEN = "-"  # what a worker without a token answers, so it is refused at once
ADMITTED = keys.ADMITTED
REFUSED = "refused:"
QUARANTINED = "quarantined: "  # a refusal's reason starts so for a banned seat


def make_challenge() -> str:
    """A fresh 128-bit nonce, hex."""
    return secrets.token_hex(16)


def sign(token: str, challenge: str, joiner_id: str) -> str:
    """The joiner's answer: HMAC-SHA256 keyed by the token over challenge + id, hex."""
    if not token:
        raise ConfigError("token='' is empty; pass the job's shared token (a non-empty string)")
    mac = hmac.new(token.encode(), (challenge + joiner_id).encode(), hashlib.sha256)
    return mac.hexdigest()


def verify(token: str, challenge: str, joiner_id: str, answer: str) -> bool:
    """True if ``answer`` proves the joiner holds ``token`` (constant-time compare)."""
    return hmac.compare_digest(sign(token, challenge, joiner_id).encode(), answer.encode())


def check_answers(
    store: Store,
    joiners: Sequence[str],
    token: str,
    *,
    timeout: float,
    poll: float = 0.01,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[str], dict[str, str]]:
    """Challenge every joiner and judge the answers; returns (accepted, refused: why).

    Accepted ids keep their order. A joiner that does not answer within ``timeout``
    seconds is refused ("no answer"). Refusals are written as verdicts here;
    acceptances are written by the caller once the new generation is published.
    """
    challenges = {j: make_challenge() for j in joiners}
    for joiner, nonce in challenges.items():
        store.delete_key(keys.response(joiner))  # an answer to an older nonce is void
        store.set(keys.challenge(joiner), nonce)
    deadline = clock() + timeout
    answers: dict[str, str] = {}
    while len(answers) < len(joiners) and clock() < deadline:
        for joiner in joiners:
            if joiner not in answers and store.check([keys.response(joiner)]):
                nonce, _, mac = store.get(keys.response(joiner)).decode().partition(":")
                if nonce == challenges[joiner]:  # else a late answer to an older nonce
                    answers[joiner] = mac
        if len(answers) < len(joiners):
            time.sleep(poll)
    accepted: list[str] = []
    refused: dict[str, str] = {}
    for joiner in joiners:
        answer = answers.get(joiner)
        if answer is None:
            refused[joiner] = f"no answer to the admission challenge within {timeout:g} s"
        elif answer == NO_TOKEN:
            refused[joiner] = "it has no token"
        elif not verify(token, challenges[joiner], joiner, answer):
            refused[joiner] = "its answer does not match the job's token (wrong token)"
        else:
            accepted.append(joiner)
    for joiner, why in refused.items():
        log.warning("refused worker %s: %s", joiner, why)
        store.set(keys.verdict(joiner), REFUSED + why)
    return accepted, refused


def answer_challenge(store: Store, joiner_id: str, token: str | None) -> None:
    """Sign the challenge waiting under ``adm/<id>/challenge`` (call once it exists).

    The response is ``<nonce>:<mac>``: naming the nonce lets the admitter ignore a late
    answer to a challenge it has since replaced.
    """
    nonce = store.get(keys.challenge(joiner_id)).decode()
    answer = sign(token, nonce, joiner_id) if token else NO_TOKEN
    store.set(keys.response(joiner_id), f"{nonce}:{answer}")


def read_verdict(store: Store, joiner_id: str) -> int | None:
    """The generation that admitted ``joiner_id``; None while undecided.

    A refusal raises ``AdmissionError`` naming the reason and the fix (``SeatBannedError``
    for a quarantined seat).
    """
    if not store.check([keys.verdict(joiner_id)]):
        return None
    verdict = store.get(keys.verdict(joiner_id)).decode()
    if verdict.startswith(ADMITTED):
        return int(verdict[len(ADMITTED):])
    why = verdict[len(REFUSED):] if verdict.startswith(REFUSED) else verdict
    if why.startswith(QUARANTINED):
        raise SeatBannedError(
            f"worker {joiner_id!r} was refused entry to the cohort: its seat was "
            f"{why}; the cohort does not readmit a quarantined worker: check that "
            "machine (hardware, code version, its data) against that evidence, and start "
            "a new run to use it again")
    raise AdmissionError(
        f"worker {joiner_id!r} was refused entry to the cohort: {why}; start it with the "
        "same token as the other workers of this job (the token is compared by "
        "challenge-response, never sent)"
    )
