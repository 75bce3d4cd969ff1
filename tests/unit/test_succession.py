"""Where the store goes when its host is lost (``potluck.succession``), and the quorum a
generation needs across nodes (``rendezvous.state``): pure rules, and the move itself
against sockets on loopback with a stand-in store."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from potluck.errors import StoreLostError
from potluck.rendezvous.state import (
    Action,
    coming,
    decide,
    has_quorum,
    node_of,
    still_coming,
)
from potluck.succession import Candidate, Succession, reachable, successors


def test_survivors_try_the_candidates_in_node_order_without_the_lost_node() -> None:
    found = [Candidate(2, "10.0.0.3", 7), Candidate(0, "10.0.0.1", 5),
             Candidate(1, "10.0.0.2", 6), Candidate(1, "10.0.0.2", 6)]  # (one twice)
    assert [c.node for c in successors(found, lost_node=0)] == [1, 2]
    assert [c.node for c in successors(found, lost_node=1)] == [0, 2]
    assert Candidate.decode(found[0].encode()) == found[0]


@pytest.mark.parametrize(("members", "ready", "ok"), [
    ("abc", "bc", True),  # 2 of 3
    ("abc", "c", False),  # 1 of 3
    ("abcd", "ab", True),  # half, with the first member
    ("abcd", "cd", False),  # the other half
    ("ab", "b", False),  # a cohort of two that lost its first member
    ("ab", "a", True),
    ("abcde", "cde", True),
])
def test_a_quorum_is_a_majority_or_the_half_with_the_first_member(
        members: str, ready: str, ok: bool) -> None:
    assert has_quorum(tuple(members), set(ready)) is ok


def test_without_a_quorum_the_leader_waits_then_fails_whatever_min_size_allows() -> None:
    members, ready = ("a", "b", "c"), {"c"}
    wait = decide(1.0, members=members, registered=ready, alive=ready, deadline=2.0,
                  min_size=1, quorum=True)
    assert wait.action is Action.WAIT
    fail = decide(3.0, members=members, registered=ready, alive=ready, deadline=2.0,
                  min_size=1, quorum=True)
    assert fail.action is Action.FAIL and "not a majority" in fail.why
    alone = decide(3.0, members=members, registered=ready, alive=ready, deadline=2.0,
                   min_size=1)  # one node: no quorum needed
    assert alone.action is Action.FORM and alone.members == ("c",)


class _Store:
    """A stand-in for a store client: what was written to it."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.keys: dict[str, Any] = {}

    def set(self, key: str, value: str) -> None:
        self.keys[key] = value


def test_the_store_moves_to_the_first_reachable_candidate_and_is_seeded_once() -> None:
    with socket.create_server(("127.0.0.1", 0)) as alive:
        dead = socket.create_server(("127.0.0.1", 0))
        dead_port = dead.getsockname()[1]
        dead.close()  # (refuses connections now)
        port = alive.getsockname()[1]
        served, connected = [], []

        def connect(c: Candidate) -> Any:
            connected.append(c.node)
            return _Store(c.where)

        succession = Succession("run", "10.9.9.9:1", connect=connect,
                                serve=lambda: served.append(1))
        succession._candidates = [Candidate(0, "10.9.9.9", 1),  # the lost host itself
                                  Candidate(1, "127.0.0.1", dead_port),
                                  Candidate(2, "127.0.0.1", port)]
        seeded: list[str] = []
        succession.seeder(lambda store: seeded.append(store.where))
        assert not reachable(Candidate(1, "127.0.0.1", dead_port))
        where = succession.moved("10.9.9.9:1", "check", "Broken pipe")
        assert where == f"127.0.0.1:{port}" and succession.node == 2
        assert served == [1] and connected == [2] and seeded == [where]
        # every later caller of the lost store finds it moved: nothing again
        assert succession.moved("10.9.9.9:1", "get", "Broken pipe") == where
        assert served == [1] and seeded == [where] and succession.moves == 1
        assert succession.lost == {0}  # (its workers are not waited for: ``coming``)


def test_with_no_candidate_reachable_the_loss_is_one_line_naming_what_was_tried() -> None:
    succession = Succession("run", "10.9.9.9:1", connect=lambda c: _Store(c.where))
    gone = socket.create_server(("127.0.0.1", 0))
    port = gone.getsockname()[1]
    gone.close()
    succession._candidates = [Candidate(1, "127.0.0.1", port)]
    with pytest.raises(StoreLostError) as lost:
        succession.moved("10.9.9.9:1", "check", "Broken pipe")
    assert f"tried 127.0.0.1:{port}" in str(lost.value) and "\n" not in str(lost.value)


def test_the_quorum_counts_nodes_and_a_node_whose_agent_beats_here_is_on_this_side() -> None:
    from potluck.rendezvous.state import node_of

    seats = {"a": "h0:node0:local0", "b": "h0:node0:local1", "c": "h1:node1:local0",
             "d": "h2:node2:local0"}
    nodes = {m: node_of(m, seat) for m, seat in seats.items()}
    members = ("a", "b", "c", "d")
    # One of node 0's two workers died: nodes 0, 1, 2 are all still here.
    assert has_quorum(members, {"a", "c", "d"}, nodes)
    # Node 0 cut off (both workers): nodes 1 and 2 of 3 go on; node 0 alone does not.
    assert has_quorum(members, {"c", "d"}, nodes)
    assert not has_quorum(members, {"a", "b"}, nodes)
    # Two nodes, node 0's only worker died but its agent beats on this store: no split.
    two = {"a": (0, "000000"), "c": (0, "000001")}
    assert not has_quorum(("a", "c"), {"c"}, two)
    assert has_quorum(("a", "c"), {"c"}, two, present={(0, "000000")})
    # The lowest node breaks a tie, whoever founded the cohort.
    assert has_quorum(("c", "a"), {"a"}, two) and not has_quorum(("c", "a"), {"c"}, two)
    assert node_of("x", "no-seat-here") == (1, "x") and node_of("y", None) == (1, "y")


def test_the_quorum_counts_from_the_last_generation_that_trained() -> None:
    # Generation (a, b, c) trained; (a, b) formed on node 0's store with a registration b
    # sent before its link was cut, and never trained. Alone, a is half of (a, b) with
    # the lowest node, but one node of the three that trained: it stops.
    nodes = {"a": (0, "000000"), "b": (0, "000001"), "c": (0, "000002")}
    fail = decide(3.0, members=("a", "b"), registered={"a"}, alive={"a"}, deadline=2.0,
                  min_size=1, quorum=True, nodes=nodes, base=("a", "b", "c"))
    assert fail.action is Action.FAIL
    form = decide(3.0, members=("a", "b"), registered={"a"}, alive={"a"}, deadline=2.0,
                  min_size=1, quorum=True, nodes=nodes)
    assert form.action is Action.FORM


def test_after_a_move_members_not_yet_there_are_coming_unless_their_node_was_lost() -> None:
    """Each survivor moves by itself: the new store has no beat yet of one still on its
    way. It is awaited; one on the lost store's node, or on no known node, is not."""
    members = ["a", "b", "c", "d"]
    nodes = {"a": node_of("a", "h:node0:local0"), "b": node_of("b", "h:node1:local0"),
             "c": node_of("c", "h:node2:local0"), "d": node_of("d", None)}
    assert coming(members, beats={"c"}, nodes=nodes, lost={0}) == {"b"}
    assert coming(members, beats={"b", "c"}, nodes=nodes, lost={0}) == set()
    assert coming(members, beats=set(), nodes=nodes, lost={0, 1}) == {"c"}


@pytest.mark.timeout(10)
def test_members_are_awaited_after_a_move_for_a_beats_timeout_and_a_settle_more() -> None:
    """A survivor on a busy 5 Mbit/s link reached the moved store more than a beat's
    timeout (5 s) after the others: it was left out of the next generation."""
    assert still_coming(0.0, heartbeat_timeout=5.0, settle_timeout=10.0)
    assert still_coming(5.5, heartbeat_timeout=5.0, settle_timeout=10.0)
    assert still_coming(15.0, heartbeat_timeout=5.0, settle_timeout=10.0)
    assert not still_coming(15.5, heartbeat_timeout=5.0, settle_timeout=10.0)


@pytest.mark.timeout(10)
def test_learning_again_reads_only_the_candidates_published_since() -> None:
    """An agent learns every second and every node of a churning run published one:
    reading them all each time was 2 requests per node ever started, per agent, per
    second. A published slot never changes, so each is read once."""
    from potluck import keys
    from potluck.succession import publish
    from tests.counting_store import CountingStore

    store = CountingStore()
    for node in range(40):
        publish(store, "run", Candidate(node, "127.0.0.1", 1000 + node))
    succession = Succession("run", "127.0.0.1:1")
    succession.learn(store)
    assert [c.node for c in succession.candidates] == list(range(40))
    store.asked.clear()
    succession.learn(store)
    assert store.calls == 1  # the count alone
    publish(store, "run", Candidate(40, "127.0.0.1", 1040))
    store.add(keys.successor_count("run"), 1)  # a slot counted, not yet written
    store.asked.clear()
    succession.learn(store)
    assert store.calls == 1 + 2 + 1 and len(succession.candidates) == 41
    store.set(keys.successor("run", 41), Candidate(41, "127.0.0.1", 1041).encode())
    succession.learn(store)
    assert [c.node for c in succession.candidates][-2:] == [40, 41]
    succession.where = "127.0.0.1:2"  # the store moved: its list is read anew
    store.asked.clear()
    succession.learn(store)
    assert store.calls == 1 + 2 * 42 and len(succession.candidates) == 42
