"""``RelayStore``: the job's store as a worker holds it, one object between it and c10d.

Every store call of a worker (the rendezvous, heartbeats, the failure watch, status
pulses, the process groups' own rendezvous) goes through it to a ``TCPStore`` client. It
is a ``torch.distributed.Store`` itself, so a process group is built on it as on the
client. What it adds: a lost connection to the store (its host's process killed, its
link cut) is ``StoreLostError``, one line that says what happened, where c10d raises a
``DistNetworkError`` from deep inside, and ``clone()`` gives a relay too (the threads
that poll keep their own connections). The relay is also where a cohort that outlives
its store's host will switch to a new one.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store

from potluck.errors import StoreLostError

T = TypeVar("T")


class RelayStore(Store):
    """``inner``'s calls, its lost connections raised as ``StoreLostError``; ``where``:
    the store's address, as the error names it."""

    def __init__(self, inner: Store, where: str) -> None:
        super().__init__()
        self._inner, self.where = inner, where
        Store.set_timeout(self, getattr(inner, "timeout"))  # noqa: B009  (stubs lack it)

    def _call(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except dist.DistNetworkError as exc:
            raise StoreLostError(self.where, what, _first_line(exc)) from None

    def set(self, key: str, value: str) -> None:
        self._call("set", lambda: self._inner.set(key, value))

    def get(self, key: str) -> bytes:
        return self._call("get", lambda: self._inner.get(key))

    def add(self, key: str, amount: int) -> int:
        return self._call("add", lambda: self._inner.add(key, amount))

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return self._call("compare_set", lambda: self._inner.compare_set(key, expected, desired))

    def check(self, keys: list[str]) -> bool:
        return self._call("check", lambda: self._inner.check(keys))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self._call("wait", lambda: self._inner.wait(keys))
        else:
            self._call("wait", lambda: self._inner.wait(keys, timeout))

    def delete_key(self, key: str) -> bool:
        return self._call("delete_key", lambda: self._inner.delete_key(key))

    def num_keys(self) -> int:
        return self._call("num_keys", lambda: self._inner.num_keys())

    def list_keys(self) -> list[str]:
        return self._call("list_keys", lambda: self._inner.list_keys())

    def clone(self) -> RelayStore:
        """A relay on a new connection to the same store."""
        inner = self._call("connect", lambda: getattr(self._inner, "clone")())  # noqa: B009
        return RelayStore(inner, self.where)


def prefixed(store: Store, prefix: str) -> Store:
    """``store``'s keys under ``prefix``: a ``PrefixStore``, or for a relay a relay over
    one (c10d's ``PrefixStore.clone()`` cannot clone a store written in Python)."""
    if isinstance(store, RelayStore):
        return RelayStore(PrefixStore(prefix, store._inner), store.where)
    return PrefixStore(prefix, store)


def _first_line(exc: BaseException) -> str:
    """c10d's message without the C++ stack trace it may carry."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
