"""StoreRendezvous on a real TCPStore, with threads as workers (one store client each)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from torch.distributed import TCPStore

from potluck.errors import AdmissionError, JobFinishedError, RendezvousError
from potluck.rendezvous import Membership, RendezvousConfig, StoreRendezvous
from potluck.testing import free_port

TOKEN = "s3cret-token"
FAST = RendezvousConfig(token=TOKEN, heartbeat_interval=0.1, heartbeat_timeout=0.6,
                        settle_timeout=4.0, join_timeout=10.0, admission_timeout=2.0,
                        expected=3)


@pytest.fixture
def port() -> Iterator[int]:
    port = free_port()
    host = TCPStore("127.0.0.1", port, None, True, timedelta(seconds=10),
                    wait_for_workers=False)
    yield port
    del host


def _client(port: int) -> TCPStore:
    return TCPStore("127.0.0.1", port, None, False, timedelta(seconds=10))


def _worker(port: int, name: str, config: RendezvousConfig = FAST) -> StoreRendezvous:
    return StoreRendezvous(_client(port), name, config)


def _together(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run each call on its own thread at once; return results (raise the first error)."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures: list[Future[Any]] = [pool.submit(call) for call in calls]
        return [f.result(timeout=30) for f in futures]


def _form(port: int, names: Sequence[str], config: RendezvousConfig = FAST,
          ) -> list[StoreRendezvous]:
    workers = [_worker(port, n, replace(config, expected=len(names))) for n in names]
    memberships = _together([w.join for w in workers])
    assert len({(m.generation, m.members) for m in memberships}) == 1
    return sorted(workers, key=lambda w: w.membership.rank if w.membership else -1)


def _same(memberships: Sequence[Membership]) -> Membership:
    assert len({(m.generation, m.members, m.leader) for m in memberships}) == 1
    assert [m.rank for m in memberships] == list(range(len(memberships)))
    return memberships[0]


def _close(workers: Sequence[StoreRendezvous]) -> None:
    for worker in workers:
        worker.close()


@pytest.mark.timeout(30)
def test_three_workers_form_generation_zero(port: int) -> None:
    workers = _form(port, ["w-a", "w-b", "w-c"])
    try:
        gen0 = _same([w.membership for w in workers if w.membership])
        assert (gen0.generation, gen0.world_size, gen0.reason) == (0, 3, "formed")
        assert set(gen0.members) == {"w-a", "w-b", "w-c"}
        assert gen0.leader == gen0.members[0]
        assert _client(port).get(f"{FAST.prefix}/current") == b"0"
    finally:
        _close(workers)


@pytest.mark.timeout(30)
def test_survivors_form_the_next_generation_without_a_silent_member(port: int) -> None:
    workers = _form(port, ["w-a", "w-b", "w-c"])
    try:
        r0, r1, r2 = workers
        r1.close()  # its heartbeat stops, as if the process died or was SIGSTOPped
        gen1 = _same(_together([lambda: r0.next_generation("peer lost"),
                                lambda: r2.next_generation("peer lost")]))
        assert gen1.generation == 1 and gen1.members == (r0.worker_id, r2.worker_id)
        assert gen1.left == (r1.worker_id,) and gen1.leader == r0.worker_id
        with pytest.raises(RendezvousError, match="left out of generation 1"):
            r1.admit()  # it comes back (SIGCONT) after the others moved on
        with pytest.raises(RendezvousError, match="left out of generation 1"):
            r1.next_generation("late")
    finally:
        _close(workers)


@pytest.mark.timeout(30)
def test_next_member_takes_over_when_the_leader_dies(port: int) -> None:
    workers = _form(port, ["w-a", "w-b", "w-c"])
    try:
        r0, r1, r2 = workers
        r0.close()  # still fresh for heartbeat_timeout: the others first wait for it
        started = time.monotonic()
        gen1 = _same(_together([lambda: r1.next_generation("peer lost"),
                                lambda: r2.next_generation("peer lost")]))
        assert gen1.members == (r1.worker_id, r2.worker_id) and gen1.leader == r1.worker_id
        assert time.monotonic() - started < FAST.settle_timeout  # stale beat, not deadline
    finally:
        _close(workers)


@pytest.mark.timeout(30)
def test_a_worker_the_agent_saw_exit_is_not_waited_for(port: int) -> None:
    from potluck.keys import process as process_key
    from potluck.launch.job_keys import mark_exited

    config = replace(FAST, heartbeat_timeout=20.0, prefix="potluck/job7/rdzv")
    workers = _form(port, ["w-a", "w-b", "w-c"], config)
    try:
        r0, r1, r2 = workers
        r2.close()  # "killed": only the agent's word can end the wait
        store = _client(port)
        store.set(process_key("job7", 4242), r2.worker_id)  # as init() writes it
        mark_exited(store, "job7", 4242)
        mark_exited(store, "job7", 999)  # a process that never joined: ignored
        started = time.monotonic()
        gen1 = _same(_together([lambda: r0.next_generation("peer lost"),
                                lambda: r1.next_generation("peer lost")]))
        assert gen1.members == (r0.worker_id, r1.worker_id) and gen1.left == (r2.worker_id,)
        assert time.monotonic() - started < 2.0
    finally:
        _close(workers)


@pytest.mark.timeout(30)
def test_a_suspected_member_is_not_waited_for(port: int) -> None:
    config = replace(FAST, heartbeat_timeout=20.0)  # only the suspicion can end the wait
    workers = _form(port, ["w-a", "w-b", "w-c"], config)
    try:
        r0, r1, r2 = workers
        r2.close()
        lost = {r2.worker_id}
        started = time.monotonic()
        gen1 = _same(_together([lambda: r0.next_generation("peer lost", lost),
                                lambda: r1.next_generation("peer lost", lost)]))
        assert gen1.members == (r0.worker_id, r1.worker_id)
        assert time.monotonic() - started < 2.0
    finally:
        _close(workers)


@pytest.mark.timeout(30)
def test_a_joiner_with_the_token_is_admitted_at_the_next_boundary(port: int) -> None:
    workers = _form(port, ["w-a", "w-b"])
    joiner = _worker(port, "w-new")
    try:
        with ThreadPoolExecutor(1) as pool:
            joined = pool.submit(joiner.join)
            _wait_until(lambda: workers[0].pending_joiners() == ["w-new"])
            gen1 = _together([w.admit for w in workers])
            mine = joined.result(timeout=10)
        founders = tuple(w.worker_id for w in workers)  # in rank order
        assert _same([*gen1, mine]).members == (*founders, "w-new")
        assert (mine.generation, mine.rank, mine.joined) == (1, 2, ("w-new",))
        assert gen1[0].members == mine.members and gen1[0].reason == "admit"
        # the next boundary with nobody waiting changes nothing
        again = _together([w.admit for w in [*workers, joiner]])
        assert {m.generation for m in again} == {1}
    finally:
        _close([*workers, joiner])


@pytest.mark.timeout(30)
@pytest.mark.parametrize("token", ["wrong-token", None])
def test_a_joiner_without_the_token_is_refused_and_nothing_changes(
    port: int, token: str | None
) -> None:
    workers = _form(port, ["w-a", "w-b"])
    stranger = _worker(port, "w-bad", replace(FAST, token=token))
    try:
        with ThreadPoolExecutor(1) as pool:
            joined = pool.submit(stranger.join)
            _wait_until(lambda: workers[0].pending_joiners() == ["w-bad"])
            after = _together([w.admit for w in workers])
            with pytest.raises(AdmissionError, match="refused") as info:
                joined.result(timeout=10)
        assert "w-bad" in str(info.value) and "same token" in str(info.value)
        assert {m.generation for m in after} == {0} and stranger.membership is None
        assert _client(port).get(f"{FAST.prefix}/current") == b"0"
        assert workers[0].pending_joiners() == []
    finally:
        _close([*workers, stranger])


@pytest.mark.timeout(30)
def test_a_graceful_leave_forms_the_next_generation_at_once(port: int) -> None:
    config = replace(FAST, heartbeat_timeout=20.0, settle_timeout=20.0)
    workers = _form(port, ["w-a", "w-b", "w-c"], config)
    try:
        r0, r1, r2 = workers
        r0.announce_leave()  # even the leader: it must not be waited for
        started = time.monotonic()
        gen1 = _same(_together([lambda: r1.next_generation("sigterm"),
                                lambda: r2.next_generation("sigterm")]))
        assert time.monotonic() - started < 2.0
        assert gen1.members == (r1.worker_id, r2.worker_id) and gen1.left == (r0.worker_id,)
        r2.announce_leave()  # at a boundary, the survivors drop it through admit()
        started = time.monotonic()
        gen2 = r1.admit()
        assert time.monotonic() - started < 1.0  # nobody left in the join queue to ask
        assert (gen2.generation, gen2.members, gen2.reason) == (2, (r1.worker_id,), "leave")
    finally:
        _close(workers)


@pytest.mark.timeout(30)
def test_too_few_survivors_is_an_error_for_everyone(port: int) -> None:
    config = replace(FAST, min_size=2, settle_timeout=0.5)
    workers = _form(port, ["w-a", "w-b"], replace(config, expected=2))
    try:
        workers[1].close()
        with pytest.raises(RendezvousError, match="min_size=2"):
            workers[0].next_generation("peer lost")
    finally:
        _close(workers)


def _wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.mark.timeout(30)
def test_a_slow_but_live_member_is_waited_for_and_leads_once_it_arrives(port: int) -> None:
    config = replace(FAST, heartbeat_timeout=20.0, settle_timeout=5.0)
    workers = _form(port, ["w-a", "w-b", "w-c"], config)
    try:
        r0, r1, r2 = workers

        def late() -> Membership:
            time.sleep(0.5)  # still inside its failed collective
            return r0.next_generation("peer lost")

        gen1 = _same(_together([late, lambda: r1.next_generation("peer lost"),
                                lambda: r2.next_generation("peer lost")]))
        assert gen1.members == tuple(w.worker_id for w in workers)
        assert gen1.leader == r0.worker_id and gen1.left == ()
    finally:
        _close(workers)


@pytest.mark.timeout(30)
def test_a_joiner_arriving_after_the_run_finished_is_told_at_once(port: int) -> None:
    founders = _form(port, ["a", "b"])
    for worker in founders:
        worker.mark_finished()
        worker.close()
    late = _worker(port, "late")  # join_timeout is 10 s: the answer must come sooner
    started = time.monotonic()
    with pytest.raises(JobFinishedError, match="arrived after the run had finished"):
        late.join()
    assert time.monotonic() - started < 2.0
