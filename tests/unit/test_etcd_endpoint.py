"""The etcd store without a server: where a job's keys live, how an endpoint is read,
the key range that covers one job and no other, and how long a lost etcd is retried."""

from __future__ import annotations

import time

import pytest

from potluck import etcd_store
from potluck.errors import RendezvousError, StoreLostError
from potluck.etcd_store import EtcdStore, job_prefix, prefix_range, split_endpoint
from potluck.testing import free_port


def test_a_jobs_keys_live_under_its_run_id() -> None:
    assert job_prefix("job7") == "/potluck/job7/"


@pytest.mark.parametrize(("endpoint", "parsed"), [
    ("10.0.0.9:2379", ("10.0.0.9", 2379)),
    ("http://etcd.example.org:2380/", ("etcd.example.org", 2380)),
    ("[fd00::1]:2379", ("fd00::1", 2379)),
])
def test_endpoints_parse(endpoint: str, parsed: tuple[str, int]) -> None:
    assert split_endpoint(endpoint) == parsed


@pytest.mark.parametrize("endpoint", ["etcd", "etcd:port", ":2379", "etcd:0", "etcd:70000"])
def test_a_bad_endpoint_names_itself_and_the_form(endpoint: str) -> None:
    with pytest.raises(RendezvousError, match=rf"{endpoint!r} is not an etcd client.*HOST:PORT"):
        split_endpoint(endpoint)


def test_the_prefix_range_covers_the_job_and_stops_before_the_next_name() -> None:
    start, end = prefix_range(job_prefix("job7"))
    assert (start, end) == (b"/potluck/job7/", b"/potluck/job70")
    assert start <= b"/potluck/job7/\xff" < end
    assert end <= b"/potluck/job70/a"  # another job's keys: out of the range


def test_under_names_keys_as_a_prefix_store_does() -> None:
    store = EtcdStore("127.0.0.1:1", job_prefix("job7"), check_reachable=False)
    assert store.under("potluck/x").prefix == "/potluck/job7/potluck/x/"


@pytest.mark.timeout(30)
def test_an_outage_is_judged_once_per_process_not_call_after_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(etcd_store, "LOST_AFTER_S", 0.6)
    endpoint = f"127.0.0.1:{free_port()}"  # (nobody listens there)
    first = EtcdStore(endpoint, job_prefix("gone"), check_reachable=False)
    other = EtcdStore(endpoint, job_prefix("gone"), check_reachable=False)
    started = time.monotonic()
    with pytest.raises(StoreLostError):
        first.set("a", "1")
    assert time.monotonic() - started >= 0.6  # the outage's first call waits it out
    started = time.monotonic()
    for store in (first, other):  # another store of the process, too
        with pytest.raises(StoreLostError):
            store.set("b", "1")
    assert time.monotonic() - started < 0.5  # once judged lost: one try each
