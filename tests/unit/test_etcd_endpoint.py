"""The etcd store's pure parts, without a server: where a job's keys live, how an
endpoint is read, and the key range that covers one job and no other."""

from __future__ import annotations

import pytest

from potluck.errors import RendezvousError
from potluck.etcd_store import EtcdStore, job_prefix, prefix_range, split_endpoint


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
