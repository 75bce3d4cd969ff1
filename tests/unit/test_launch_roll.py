"""The elastic agents' roll (who node 0 still waits for at the end) and the keys a whole
restart of a plain torch.distributed job clears."""

from __future__ import annotations

import threading
import time

import pytest
from torch._C._distributed_c10d import HashStore

from potluck import keys
from potluck.launch.job_keys import clear_for_whole_restart, holds_torch_keys
from potluck.launch.policy import RollCall, roll_call
from potluck.launch.roll import agent_beats, wait_for_roll


def test_an_agent_whose_beat_stopped_is_lost_and_not_waited_for() -> None:
    call = roll_call([1, 2], {1: 100.0, 2: 94.0}, now=100.5, timeout=5.0)
    assert call == RollCall(waiting=(1,), lost=(2,))


def test_an_agent_that_has_not_beaten_yet_is_waited_for() -> None:
    assert roll_call([3], {}, now=100.0, timeout=5.0) == RollCall(waiting=(3,), lost=())


def test_nobody_pending_means_nobody_to_wait_for() -> None:
    assert roll_call([], {1: 0.0}, now=100.0, timeout=5.0) == RollCall((), ())


def test_a_whole_restart_clears_torchs_and_the_cohorts_keys_only() -> None:
    store = HashStore()
    kept = [keys.agents("job", "started"), keys.agents("job", "roll/who/0"),
            keys.status_count("job"), keys.status_slot("job", 0)]
    cleared = ["default_pg/0//cpu//0/0", f"{keys.rendezvous_root('job')}/founder",
               keys.process("job", 42, "host"), keys.elastic_root("job") + "/g0/x"]
    for key in kept + cleared:
        store.set(key, "1")
    assert holds_torch_keys(store)
    assert clear_for_whole_restart(store, "job") == len(cleared)
    assert sorted(store.list_keys()) == sorted(kept)
    assert not holds_torch_keys(store)


def test_a_worker_put_out_by_trust_is_not_restarted() -> None:
    from potluck.launch.policy import not_to_restart
    from potluck.launch.report import ErrorRecord

    def died(exc_type: str) -> ErrorRecord:
        return ErrorRecord(1.0, exc_type, "...", "Traceback...\n")

    assert not_to_restart(died("QuarantinedError"))
    assert not_to_restart(died("SeatBannedError"))  # its return refused at admission
    assert not not_to_restart(died("AdmissionError"))  # a wrong token: restarts are due
    assert not not_to_restart(died("RuntimeError")) and not not_to_restart(None)


@pytest.mark.timeout(20)
def test_node_0_asks_once_about_an_agent_that_checked_out_and_reads_beats_as_they_change(
) -> None:
    """Node 0 waits for the roll from its own workers' end on, most of a run that lost
    them early, and a churning run's roll holds every node ever started: an agent that
    checked out is asked about once, and the beats (one a second) are read twice a
    second, not at every poll."""
    from tests.counting_store import CountingStore

    store = CountingStore()
    store.add(keys.agents("job", "started"), 40)
    for agent in range(38):
        store.set(keys.agents("job", f"roll/done/{agent}"), "1")
    beats = agent_beats(store, "job")
    for agent in (38, 39):
        beats.set(keys.heartbeat(f"agent{agent}"), f"{time.time():.6f}")
    store.asked.clear()
    waiter = threading.Thread(target=wait_for_roll,
                              args=(store, "job", 10.0, lambda: False, lambda *_: None))
    waiter.start()
    time.sleep(1.6)
    for agent in (38, 39):
        store.set(keys.agents("job", f"roll/done/{agent}"), "1")
    waiter.join(timeout=5)
    assert not waiter.is_alive()
    assert store.asked[keys.agents("job", "roll/done/0")] == 1
    beat = f"{keys.agents('job', 'roll/beats')}/{keys.heartbeat('agent38')}"
    assert 2 <= store.asked[beat] <= 2 * 5  # (check and get, each half second)
