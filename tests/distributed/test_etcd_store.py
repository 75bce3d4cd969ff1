"""``EtcdStore`` against a real etcd server (``tests/etcd.py``: installed with apt-get
when missing on a root Debian machine, skipped elsewhere): every c10d call potluck
makes, atomic ``add`` and ``compare_set`` races from two processes, a Gloo group built
on it, and the one-line errors when etcd is unreachable or lost."""

from __future__ import annotations

import gc
import multiprocessing as mp
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore

from potluck.errors import RendezvousError, StoreLostError
from potluck.etcd_store import EtcdStore, job_prefix
from potluck.relay import RelayStore, for_c10d, prefixed
from potluck.testing import free_port
from tests import etcd

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[etcd.Etcd]:
    why = etcd.why_no_etcd()
    if why is not None:
        pytest.skip(why)
    with etcd.server(tmp_path / "etcd") as server:
        yield server


@pytest.fixture
def store(running: etcd.Etcd) -> EtcdStore:
    return EtcdStore(running.endpoint, job_prefix("test"), timedelta(seconds=5))


def test_set_get_check_delete_and_listing(store: EtcdStore) -> None:
    assert store.num_keys() == 0 and store.list_keys() == []
    store.set("a", "1")
    store.set("b/c", b"\x00\xffbytes")
    assert store.get("a") == b"1"
    assert store.get("b/c") == b"\x00\xffbytes"
    assert store.check(["a", "b/c"]) and not store.check(["a", "missing"])
    assert sorted(store.list_keys()) == ["a", "b/c"] and store.num_keys() == 2
    assert store.delete_key("a") and not store.delete_key("a")
    assert store.list_keys() == ["b/c"]


def test_keys_stay_under_the_jobs_prefix(running: etcd.Etcd, store: EtcdStore) -> None:
    other = EtcdStore(running.endpoint, job_prefix("other"), timedelta(seconds=5))
    store.set("k", "mine")
    other.set("k", "theirs")
    assert store.get("k") == b"mine" and other.get("k") == b"theirs"
    assert store.num_keys() == 1 and other.list_keys() == ["k"]


def test_get_and_wait_block_until_the_key_or_the_timeout(store: EtcdStore) -> None:
    writer = store.clone()
    timer = threading.Timer(0.3, lambda: writer.set("late", "here"))
    timer.start()
    try:
        assert store.get("late") == b"here"
    finally:
        timer.join()
    store.wait(["late"], timedelta(seconds=1))
    with pytest.raises(dist.DistStoreError, match="timeout"):
        store.wait(["never"], timedelta(seconds=0.3))
    store.set_timeout(timedelta(seconds=0.3))
    with pytest.raises(dist.DistStoreError, match="timeout"):
        store.get("never")


def test_compare_set_follows_c10d(store: EtcdStore) -> None:
    assert store.compare_set("k", "x", "y") == b"x"  # absent, expected not "": unchanged
    assert not store.check(["k"])
    assert store.compare_set("k", "", "first") == b"first"  # "" creates an absent key
    assert store.compare_set("k", "", "second") == b"first"  # present: no swap
    assert store.compare_set("k", "wrong", "z") == b"first"
    assert store.compare_set("k", "first", "swapped") == b"swapped"
    assert store.get("k") == b"swapped"


def test_add_counts_from_zero(store: EtcdStore) -> None:
    assert store.add("n", 3) == 3
    assert store.add("n", -1) == 2
    assert store.get("n") == b"2"


def _adder(endpoint: str, times: int, results: mp.Queue) -> None:  # type: ignore[type-arg]
    mine = EtcdStore(endpoint, job_prefix("test"), timedelta(seconds=10))
    results.put([mine.add("count", 1) for _ in range(times)])


def _claimer(endpoint: str, who: str, results: mp.Queue) -> None:  # type: ignore[type-arg]
    mine = EtcdStore(endpoint, job_prefix("test"), timedelta(seconds=10))
    mine.wait(["go"])
    results.put((who, mine.compare_set("seat", "", who)))


def test_add_is_atomic_across_two_processes(running: etcd.Etcd, store: EtcdStore) -> None:
    context = mp.get_context("spawn")
    results: mp.Queue = context.Queue()  # type: ignore[type-arg]
    workers = [context.Process(target=_adder, args=(running.endpoint, 40, results))
               for _ in range(2)]
    for worker in workers:
        worker.start()
    seen = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
    assert sorted(seen[0] + seen[1]) == list(range(1, 81))  # each total handed out once
    assert store.get("count") == b"80"


def test_compare_set_race_has_one_winner(running: etcd.Etcd, store: EtcdStore) -> None:
    context = mp.get_context("spawn")
    results: mp.Queue = context.Queue()  # type: ignore[type-arg]
    workers = [context.Process(target=_claimer, args=(running.endpoint, who, results))
               for who in ("left", "right")]
    for worker in workers:
        worker.start()
    store.set("go", "1")
    answers = dict(results.get(timeout=60) for _ in workers)
    for worker in workers:
        worker.join(timeout=30)
    winner = store.get("seat").decode()
    assert winner in ("left", "right")
    assert answers == {"left": winner.encode(), "right": winner.encode()}


def test_a_relay_over_it_prefixes_and_clones(store: EtcdStore) -> None:
    relay = RelayStore(store, store.endpoint)
    inner = prefixed(relay, "potluck/x")
    inner.set("k", "v")
    assert store.get("potluck/x/k") == b"v"
    assert inner.clone().get("k") == b"v"


def _gloo_rank(endpoint: str, rank: int, results: mp.Queue) -> None:  # type: ignore[type-arg]
    store = EtcdStore(endpoint, job_prefix("gloo"), timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=timedelta(seconds=30))
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    dist.destroy_process_group()
    results.put(value.item())


def test_a_gloo_group_forms_on_it(running: etcd.Etcd) -> None:
    context = mp.get_context("spawn")
    results: mp.Queue = context.Queue()  # type: ignore[type-arg]
    ranks = [context.Process(target=_gloo_rank, args=(running.endpoint, rank, results))
             for rank in range(2)]
    for rank in ranks:
        rank.start()
    sums = [results.get(timeout=90) for _ in ranks]
    for rank in ranks:
        rank.join(timeout=30)
    assert sums == [3.0, 3.0]


def test_unreachable_at_start_is_one_line_naming_the_endpoint() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    with pytest.raises(RendezvousError) as caught:
        EtcdStore(endpoint, job_prefix("test"))
    text = str(caught.value)
    assert endpoint in text and "--rdzv-endpoint" in text and "\n" not in text


def test_a_lost_server_is_store_lost_error(running: etcd.Etcd, store: EtcdStore,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import potluck.etcd_store as module

    monkeypatch.setattr(module, "LOST_AFTER_S", 0.5)
    store.set("k", "v")
    etcd.stop(running.process)
    with pytest.raises(StoreLostError) as caught:
        store.get("k")
    assert running.endpoint in str(caught.value) and "\n" not in str(caught.value)


def test_what_a_process_group_holds_of_a_relay_over_etcd_keeps_its_methods(
        store: EtcdStore) -> None:
    # A Python store that only C++ holds loses its methods ("Not implemented"): the
    # store a group is built on must stay alive on the Python side (the relay's own).
    held = PrefixStore("group", for_c10d(RelayStore(store, store.endpoint)))
    gc.collect()
    held.set("k", "v")
    assert store.get("group/k") == b"v" and held.get("k") == b"v"
