"""``CountingStore``: an in-memory c10d store that counts the requests made to it, by
key, so a test can bound what a polling loop costs the job's store."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from torch._C._distributed_c10d import HashStore, Store


class CountingStore(Store):
    """A ``HashStore`` behind a c10d ``Store`` (so a ``PrefixStore`` may wrap it) that
    counts each request; ``asked[key]``: requests naming ``key``."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = HashStore()
        self.asked: Counter[str] = Counter()
        Store.set_timeout(self, timedelta(seconds=5))

    @property
    def calls(self) -> int:
        return sum(self.asked.values())

    def set(self, key: str, value: str) -> None:
        self.asked[key] += 1
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        self.asked[key] += 1
        return bytes(self.inner.get(key))

    def add(self, key: str, amount: int) -> int:
        self.asked[key] += 1
        return int(self.inner.add(key, amount))

    def check(self, keys: list[str]) -> bool:
        for key in keys:
            self.asked[key] += 1
        return bool(self.inner.check(keys))

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        self.asked[key] += 1
        return bytes(self.inner.compare_set(key, expected, desired))

    def delete_key(self, key: str) -> bool:
        self.asked[key] += 1
        return bool(self.inner.delete_key(key))

    def clone(self) -> CountingStore:
        """The same store and count (a thread's own connection, in a real client)."""
        return self

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        for key in keys:
            self.asked[key] += 1
        self.inner.wait(keys, timeout or timedelta(seconds=5))
