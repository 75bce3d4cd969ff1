"""Rendezvous without sockets: transitions, decide(), the admission MAC, freshness, records."""

from __future__ import annotations

import json

import pytest

from potluck.errors import AdmissionError, ConfigError, RendezvousError
from potluck.rendezvous import (
    Action,
    Generation,
    RendezvousConfig,
    admit,
    decide,
    leave,
    survivors,
)
from potluck.rendezvous.admission import sign, verify
from potluck.rendezvous.heartbeat import fresh
from potluck.rendezvous.membership import Record
from potluck.rendezvous.state import Decision, pick_leader

pytestmark = pytest.mark.timeout(10)

G0 = Generation(0, ("a", "b", "c", "d"))


def test_survivors_keep_their_order_and_ranks_shift_down() -> None:
    g1 = survivors(G0, {"b"})
    assert g1 == Generation(1, ("a", "c", "d"))
    assert [g1.rank_of(m) for m in ("a", "c", "d")] == [0, 1, 2]
    assert survivors(G0, set()).members == G0.members
    assert leave(G0, ["a", "d"]) == Generation(1, ("b", "c"))


def test_admit_appends_joiners_once_and_skips_members() -> None:
    g1 = admit(G0, ["x", "a", "y", "x"])
    assert g1 == Generation(1, ("a", "b", "c", "d", "x", "y"))
    assert g1.world_size == 6


def test_generation_rejects_duplicates_and_unknown_ids() -> None:
    with pytest.raises(ConfigError, match="twice"):
        Generation(0, ("a", "a"))
    with pytest.raises(ConfigError, match="not a member"):
        G0.rank_of("z")


def test_leader_is_the_lowest_ranked_live_member() -> None:
    assert pick_leader(G0.members, {"c", "b"}) == "b"
    assert pick_leader(G0.members, set()) is None


def _decide(now: float, registered: set[str], alive: set[str], min_size: int = 1) -> Decision:
    return decide(now, members=G0.members, registered=registered, alive=alive,
                  deadline=10.0, min_size=min_size)


def test_decide_waits_for_every_live_member_then_forms_in_rank_order() -> None:
    waiting = _decide(1.0, {"c", "a"}, {"a", "b", "c"})
    assert waiting.action is Action.WAIT and waiting.waiting_for == ("b",)
    formed = _decide(1.0, {"c", "a", "b"}, {"a", "b", "c"})
    assert formed.action is Action.FORM and formed.members == ("a", "b", "c")


def test_decide_forms_without_a_silent_member_at_the_deadline() -> None:
    late = _decide(10.0, {"a", "c"}, {"a", "b", "c"})
    assert late.action is Action.FORM and late.members == ("a", "c")
    assert "b" in late.why


def test_decide_fails_below_min_size_only_at_the_deadline() -> None:
    assert _decide(1.0, {"a"}, {"a"}, min_size=2).action is Action.WAIT
    failed = _decide(10.0, {"a"}, {"a"}, min_size=2)
    assert failed.action is Action.FAIL and "min_size=2" in failed.why


def test_hmac_answer_binds_token_challenge_and_id() -> None:
    answer = sign("secret", "nonce", "w1")
    assert verify("secret", "nonce", "w1", answer)
    assert not verify("other", "nonce", "w1", answer)
    assert not verify("secret", "nonce2", "w1", answer)
    assert not verify("secret", "nonce", "w2", answer)
    assert "secret" not in answer
    with pytest.raises(ConfigError, match="empty"):
        sign("", "nonce", "w1")


def test_fresh_is_age_at_most_timeout() -> None:
    assert fresh(10.0, {"a": 9.0, "b": 4.9, "c": 5.0}, 5.0) == {"a", "c"}


def test_admission_error_is_a_rendezvous_error() -> None:
    assert issubclass(AdmissionError, RendezvousError)


def test_record_round_trips_and_event_is_json() -> None:
    record = Record(3, ("a", "c"), "a", "peer lost", left=("b",))
    assert Record.decode(record.encode().encode()) == record
    membership = record.membership("c", 0.01234)
    assert (membership.rank, membership.world_size, membership.left) == (1, 2, ("b",))
    assert membership.event is not None
    event = json.loads(membership.event.as_json())
    assert event == {"generation": 3, "cause": "peer lost", "joined": [], "left": ["b"],
                     "leader": "a", "worker": "c", "waited_s": 0.0123}


def test_config_names_the_bad_value() -> None:
    with pytest.raises(ConfigError, match="heartbeat_timeout=1"):
        RendezvousConfig(token="t", heartbeat_interval=1.0, heartbeat_timeout=1.0)
    with pytest.raises(ConfigError, match="min_size=3"):
        RendezvousConfig(token="t", expected=2, min_size=3)
    with pytest.raises(ConfigError, match="settle_timeout=0"):
        RendezvousConfig(token="t", settle_timeout=0)
