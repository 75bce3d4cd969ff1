"""Admission exchange and heartbeats on an in-memory store (HashStore: no sockets); a
heartbeat outlives transient store errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from torch.distributed import HashStore

from potluck import keys
from potluck.errors import AdmissionError
from potluck.rendezvous.admission import (
    answer_challenge,
    check_answers,
    read_verdict,
    sign,
)
from potluck.rendezvous.heartbeat import Heartbeat, fresh, read_beats, write_beat

pytestmark = pytest.mark.timeout(20)


def _answer_when_challenged(store: HashStore, joiner: str, token: str | None) -> None:
    deadline = time.monotonic() + 5
    while not store.check([keys.challenge(joiner)]) and time.monotonic() < deadline:
        time.sleep(0.005)
    answer_challenge(store, joiner, token)


def _exchange(store: HashStore, answers: dict[str, str | None]) -> tuple[list[str], dict[str, str]]:
    threads = [threading.Thread(target=_answer_when_challenged, args=(store, j, t))
               for j, t in answers.items()]
    for thread in threads:
        thread.start()
    try:
        return check_answers(store, list(answers), "good", timeout=3.0, poll=0.005)
    finally:
        for thread in threads:
            thread.join()


def test_right_token_is_accepted_and_others_refused_with_a_reason() -> None:
    store = HashStore()
    accepted, refused = _exchange(store, {"ok": "good", "bad": "evil", "none": None})
    assert accepted == ["ok"]
    assert "wrong token" in refused["bad"] and "no token" in refused["none"]
    assert read_verdict(store, "ok") is None  # the caller writes it once published
    with pytest.raises(AdmissionError, match=r"'bad' was refused.*wrong token"):
        read_verdict(store, "bad")
    for key in ("ok", "bad", "none"):  # the token itself never reaches the store
        assert b"good" not in store.get(keys.response(key))


def _forge(store: HashStore, joiner: str, make: Callable[[str], str]) -> threading.Thread:
    def run() -> None:
        deadline = time.monotonic() + 5
        while not store.check([keys.challenge(joiner)]) and time.monotonic() < deadline:
            time.sleep(0.005)
        store.set(keys.response(joiner), make(store.get(keys.challenge(joiner)).decode()))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_an_answer_cannot_be_replayed_for_another_id_or_nonce() -> None:
    store = HashStore()
    other_id = _forge(store, "thief", lambda n: f"{n}:{sign('good', n, 'victim')}")
    old_nonce = _forge(store, "late", lambda n: f"older:{sign('good', 'older', 'late')}")
    accepted, refused = check_answers(store, ["thief", "late"], "good", timeout=0.3,
                                      poll=0.005)
    other_id.join()
    old_nonce.join()
    assert accepted == []
    assert "wrong token" in refused["thief"]  # a valid MAC, but bound to another id
    assert "no answer" in refused["late"]  # an answer to a replaced nonce is ignored


def test_silent_joiner_is_refused_after_the_timeout() -> None:
    started = time.monotonic()
    accepted, refused = check_answers(HashStore(), ["mute"], "good", timeout=0.2, poll=0.01)
    assert accepted == [] and "no answer" in refused["mute"]
    assert time.monotonic() - started < 2.0


def test_heartbeat_beats_until_stopped_then_ages() -> None:
    store = HashStore()
    beat = Heartbeat(store, "w", interval=0.05).start()
    try:
        first = read_beats(store, ["w", "never"])
        assert set(first) == {"w"}
        time.sleep(0.2)
        assert read_beats(store, ["w"])["w"] > first["w"]
    finally:
        beat.stop()
    assert not beat.running
    last = read_beats(store, ["w"])["w"]
    time.sleep(0.15)
    assert read_beats(store, ["w"])["w"] == last
    assert fresh(last + 0.1, {"w": last}, timeout=0.05) == set()


class _Flaky(HashStore):
    """A store whose next ``failures`` writes fail as over a lost connection; a clone (a
    new connection) is the store itself, counted."""

    def __init__(self, failures: float) -> None:
        super().__init__()
        self.failures, self.clones = failures, 0

    def clone(self) -> _Flaky:
        self.clones += 1
        return self

    def _fail(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("Connection reset by peer")

    def set(self, key: str, value: str) -> None:
        self._fail()
        super().set(key, value)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        self._fail()
        return super().compare_set(key, expected, desired)


def test_a_heartbeat_goes_on_after_transient_store_errors() -> None:
    store = _Flaky(failures=0)
    beat = Heartbeat(store, "w", interval=0.02, patience=5.0).start()
    try:
        store.failures = 5  # five beats in a row fail: 0.1 s without a beat
        deadline = time.monotonic() + 5
        while store.failures and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)
        assert beat.running and store.clones >= 5  # a new connection for each retry
        assert time.monotonic() - beat.last_ok < 0.5  # beats get through again
        assert time.time() - read_beats(store, ["w"])["w"] < 0.5
    finally:
        beat.stop()


def test_a_heartbeat_gives_up_after_its_patience() -> None:
    store = _Flaky(failures=0)
    beat = Heartbeat(store, "w", interval=0.02, patience=0.3).start()
    try:
        store.failures = float("inf")
        time.sleep(0.2)
        assert beat.running  # within its patience: still trying
        deadline = time.monotonic() + 5
        while beat.running and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not beat.running
        assert time.monotonic() - beat.last_ok >= 0.3
    finally:
        beat.stop()


class _Overtaken(HashStore):
    """A store on which the next write of a beat lands after another one of the same
    worker (``later``): as when a relay makes a held-up beat again on a store that moved,
    after the move wrote back a later beat."""

    def __init__(self) -> None:
        super().__init__()
        self.later: str | None = None

    def clone(self) -> _Overtaken:
        return self

    def _overtake(self, key: str) -> None:
        if self.later is not None:
            later, self.later = self.later, None
            super().set(key, later)

    def set(self, key: str, value: str) -> None:
        self._overtake(key)
        super().set(key, value)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        self._overtake(key)
        return super().compare_set(key, expected, desired)


def test_a_held_up_beat_never_puts_an_older_time_over_a_later_one() -> None:
    store = _Overtaken()
    times = iter([100.0, 102.0, 104.0])
    beat = Heartbeat(store, "w", interval=60.0, clock=lambda: next(times)).start()
    try:
        store.later = "103.000000"  # written back by a move while the beat was held up
        beat.beat()  # the beat of 102 lands after it
        assert read_beats(store, ["w"])["w"] == 103.0  # (a set put 102 there)
        beat.beat()  # and the next one goes over it
        assert read_beats(store, ["w"])["w"] == 104.0
    finally:
        beat.stop()


def test_a_beat_creates_its_key_and_replaces_an_older_one_or_its_own() -> None:
    store = HashStore()  # a store that moved and holds no beat of this worker
    assert write_beat(store, "w", 5.0, last="3.000000") == "5.000000"
    store.set(keys.heartbeat("w"), "1.000000")  # an older one, of another writer
    assert write_beat(store, "w", 6.0, last="5.000000") == "6.000000"
    # its own last one, even later (the wall clock stepped back): replaced, so that a
    # clock set back does not freeze the beat for as long
    assert write_beat(store, "w", 2.0, last="6.000000") == "2.000000"
    assert read_beats(store, ["w"])["w"] == 2.0


class _Restless(HashStore):
    """A store whose heartbeat key another writer changes before every write."""

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        super().set(key, "1.000000" if expected != "1.000000" else "0.500000")
        return super().compare_set(key, expected, desired)


def test_a_beat_that_cannot_land_fails_and_one_equal_to_its_last_still_lands() -> None:
    # the same value again on a store without it: an echo of the expected value is not
    # a write
    store = HashStore()
    assert write_beat(store, "w", 5.0, last="5.000000") == "5.000000"
    assert read_beats(store, ["w"])["w"] == 5.0
    with pytest.raises(RuntimeError, match="changed under each"):  # (the heartbeat's
        write_beat(_Restless(), "w", 5.0)  # thread retries it on a new connection)
