"""``EtcdStore``: the job's store kept in an etcd cluster the site already runs.

It is a ``torch.distributed.Store`` written in Python, so potluck's rendezvous, its
heartbeats and its failure marks live there, and a process group is built on it as on
a ``TCPStore``. No agent hosts anything: losing node 0 loses none of the membership.

Every key lives under the job's prefix, ``/potluck/<run id>/``. Values are bytes.
The semantics are c10d's:

- ``get`` and ``wait`` block until the keys exist, or the store's timeout passes
  (then ``DistStoreError``, as c10d raises);
- ``add`` is atomic: a transaction that compares the key's ``mod_revision``, retried
  until no other writer came between the read and the write;
- ``compare_set`` with ``expected`` "" creates an absent key; it returns the value now
  held (``expected`` itself when the key is absent and ``expected`` is not "").

The client is etcd's own v3 JSON gateway (``/v3/kv/...``, keys and values in base64),
spoken over the standard library's ``http.client``. It is served by etcd 3.4 and later
on the client port, so it needs no dependency. The ``etcd3`` package's newest release
(0.12.0) is from 2020: its generated protobuf code fails to import under protobuf 4
and later. ``etcd3gw`` speaks the same gateway but brings three dependencies for five
calls. Blocking reads poll (every 10 ms, backing off to 100 ms): a watch stream would
need a reader thread per call.

A broken connection is retried until etcd has failed every call of the process for
``LOST_AFTER_S``; then it is ``StoreLostError``, one line, and later calls try once.
``add``'s transaction is not retried once sent: it may have been applied.
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch._C._distributed_c10d import Store

from potluck.errors import RendezvousError, StoreLostError

LOST_AFTER_S = 5.0  # connection failures this long in a row: the store is lost
REQUEST_S = 10.0  # one HTTP request's socket timeout
_POLL_FIRST_S, _POLL_MAX_S = 0.01, 0.1

Json = dict[str, Any]


class _Outages:
    """Since when each endpoint's calls fail, for the whole process: an outage is
    judged once. Every store, clone and thread of a process that calls while etcd is
    down counts from the first failure, so once it was down ``LOST_AFTER_S``, a call
    tries once and fails (not ``LOST_AFTER_S`` again, call after call, as an agent's
    shutdown makes a dozen)."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}
        self._lock = threading.Lock()

    def failed(self, endpoint: str) -> float:
        """A call to ``endpoint`` failed: how long its calls have failed (seconds)."""
        now = time.monotonic()
        with self._lock:
            return now - self._since.setdefault(endpoint, now)

    def ended(self, endpoint: str) -> None:
        """A call to ``endpoint`` was answered."""
        if endpoint in self._since:
            with self._lock:
                self._since.pop(endpoint, None)


_OUTAGES = _Outages()


class _Refused(Exception):
    """etcd answered with an error status (not a lost connection)."""


def job_prefix(run_id: str) -> str:
    """Where one job's keys live in etcd."""
    return f"/potluck/{run_id}/"


def prefix_range(prefix: str) -> tuple[bytes, bytes]:
    """etcd's range of every key that starts with ``prefix``: [start, end)."""
    start = prefix.encode()
    return start, start[:-1] + bytes([start[-1] + 1])  # the first key past the prefix


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``HOST:PORT`` (an ``http://`` in front is allowed) as (host, port)."""
    bare = endpoint.removeprefix("http://").rstrip("/")
    host, _, port = bare.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RendezvousError(
            f"--rdzv-endpoint {endpoint!r} is not an etcd client address: give HOST:PORT, "
            "e.g. etcd.example.org:2379")
    return host.strip("[]"), int(port)


class EtcdStore(Store):
    """The keys under ``prefix`` in the etcd cluster whose client URL is ``endpoint``
    (``HOST:PORT``). ``check_reachable``: answer one request now, or raise
    ``RendezvousError`` naming the endpoint and the fix."""

    def __init__(self, endpoint: str, prefix: str, timeout: timedelta = timedelta(minutes=5),
                 *, check_reachable: bool = True) -> None:
        super().__init__()
        self.endpoint, self.prefix = endpoint, prefix
        self._host, self._port = split_endpoint(endpoint)
        self._connection: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()  # one request at a time on the one connection
        Store.set_timeout(self, timeout)
        if check_reachable:
            self._check_reachable()

    # -- the c10d calls ---------------------------------------------------------

    def set(self, key: str, value: str | bytes) -> None:
        self._request("set", "/v3/kv/put", {"key": self._key(key), "value": _b64(value)})

    def get(self, key: str) -> bytes:
        found: list[bytes] = []
        self._until(lambda: self._read(key, found), [key])
        return found[0]

    def add(self, key: str, amount: int) -> int:
        while True:
            kv = self._range_one("add", key)
            current = int(_unb64(kv["value"])) if kv else 0
            revision = kv.get("mod_revision", "0") if kv else "0"
            total = current + amount
            answer = self._request("add", "/v3/kv/txn", {
                "compare": [{"key": self._key(key), "target": "MOD", "result": "EQUAL",
                             "mod_revision": revision}],
                "success": [{"request_put": {"key": self._key(key),
                                             "value": _b64(str(total))}}],
            }, retry=False)
            if answer.get("succeeded", False):
                return total

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        want, new = _bytes(expected), _bytes(desired)
        if want == b"":  # create if absent
            answer = self._txn_put("compare_set", key, new,
                                   {"target": "CREATE", "create_revision": "0"})
            if answer is None:
                return new
            if answer != b"":
                return answer
        answer = self._txn_put("compare_set", key, new,
                               {"target": "VALUE", "value": _b64(want)})
        if answer is None:
            return new
        return answer if answer or self.check([key]) else want

    def check(self, keys: list[str]) -> bool:
        return all(self._range_one("check", key) is not None for key in keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._until(lambda: self.check(keys), keys, timeout)

    def delete_key(self, key: str) -> bool:
        answer = self._request("delete_key", "/v3/kv/deleterange", {"key": self._key(key)})
        return int(answer.get("deleted", "0")) > 0

    def num_keys(self) -> int:
        answer = self._request("num_keys", "/v3/kv/range",
                               {**self._whole_prefix(), "count_only": True})
        return int(answer.get("count", "0"))

    def list_keys(self) -> list[str]:
        answer = self._request("list_keys", "/v3/kv/range",
                               {**self._whole_prefix(), "keys_only": True})
        return [_unb64(kv["key"]).decode()[len(self.prefix):]
                for kv in answer.get("kvs", [])]

    def clear(self) -> int:
        """Delete every key under this store's prefix (a finished job's); how many."""
        answer = self._request("clear", "/v3/kv/deleterange", self._whole_prefix())
        return int(answer.get("deleted", "0"))

    def clone(self) -> EtcdStore:
        """The same keys on a connection of its own (for another thread)."""
        return EtcdStore(self.endpoint, self.prefix, self._limit(), check_reachable=False)

    def under(self, prefix: str) -> EtcdStore:
        """These keys under ``prefix``, as c10d's ``PrefixStore`` names them
        (``prefix/key``). Unlike a ``PrefixStore`` over this store, it clones."""
        return EtcdStore(self.endpoint, f"{self.prefix}{prefix}/", self._limit(),
                         check_reachable=False)

    # -- requests ---------------------------------------------------------------

    def _limit(self) -> timedelta:
        """The store's timeout (c10d's ``Store.timeout``, which set_timeout changes)."""
        limit: timedelta = getattr(self, "timeout")  # noqa: B009  (the stubs lack it)
        return limit

    def _key(self, key: str) -> str:
        return _b64(self.prefix + key)

    def _whole_prefix(self) -> Json:
        start, end = prefix_range(self.prefix)
        return {"key": _b64(start), "range_end": _b64(end)}

    def _range_one(self, what: str, key: str) -> Json | None:
        kvs = self._request(what, "/v3/kv/range", {"key": self._key(key)}).get("kvs", [])
        return kvs[0] if kvs else None

    def _read(self, key: str, found: list[bytes]) -> bool:
        kv = self._range_one("get", key)
        if kv is not None:
            found.append(_unb64(kv.get("value", "")))
        return kv is not None

    def _txn_put(self, what: str, key: str, value: bytes, compare: Json) -> bytes | None:
        """Put ``value`` if ``compare`` holds: None, or the value held now."""
        answer = self._request(what, "/v3/kv/txn", {
            "compare": [{"key": self._key(key), "result": "EQUAL", **compare}],
            "success": [{"request_put": {"key": self._key(key), "value": _b64(value)}}],
            "failure": [{"request_range": {"key": self._key(key)}}],
        })
        if answer.get("succeeded", False):
            return None
        kvs = answer["responses"][0]["response_range"].get("kvs", [])
        return _unb64(kvs[0].get("value", "")) if kvs else b""

    def _until(self, done: Callable[[], bool], keys: list[str],
               timeout: timedelta | None = None) -> None:
        """Poll ``done()`` until true; past the timeout, c10d's ``DistStoreError``."""
        limit = (timeout or self._limit()).total_seconds()
        deadline = time.monotonic() + limit
        pause = _POLL_FIRST_S
        while not done():
            if time.monotonic() >= deadline:
                raise dist.DistStoreError(
                    f"wait timeout after {limit * 1000:.0f}ms, keys: {keys} "
                    f"(etcd at {self.endpoint})")
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)

    def _request(self, what: str, path: str, body: Json, *, retry: bool = True) -> Json:
        """POST ``body`` to ``path``; connection failures are retried for
        ``LOST_AFTER_S`` (``retry``), then ``StoreLostError``."""
        payload = json.dumps(body).encode()
        while True:
            try:
                with self._lock:
                    answer = self._post(path, payload)
                _OUTAGES.ended(self.endpoint)
                return answer
            except _Refused as exc:
                raise RendezvousError(
                    f"etcd at {self.endpoint} refused {what} ({exc}): check that it runs "
                    "etcd 3.4 or later and that this job may write under "
                    f"{self.prefix!r} (etcd's log says why)") from None
            except (OSError, http.client.HTTPException) as exc:
                self._close()
                if not retry or _OUTAGES.failed(self.endpoint) >= LOST_AFTER_S:
                    cause = str(exc) or type(exc).__name__
                    raise StoreLostError(self.endpoint, what, cause, etcd=True) from None
                time.sleep(0.2)

    def _post(self, path: str, payload: bytes) -> Json:
        if self._connection is None:
            self._connection = http.client.HTTPConnection(self._host, self._port,
                                                          timeout=REQUEST_S)
        self._connection.request("POST", path, payload,
                                 {"Content-Type": "application/json"})
        reply = self._connection.getresponse()
        text = reply.read()
        if reply.status != 200:
            raise _Refused(f"HTTP {reply.status} from {path}: {text[:200]!r}")
        answer: Json = json.loads(text)
        return answer

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _check_reachable(self) -> None:
        try:
            with self._lock:
                self._post("/v3/kv/range", json.dumps({**self._whole_prefix(),
                                                        "count_only": True}).encode())
        except (OSError, http.client.HTTPException, _Refused, ValueError) as exc:
            self._close()
            raise RendezvousError(
                f"cannot reach etcd at {self.endpoint} ({str(exc) or type(exc).__name__}): "
                "start etcd there, or give --rdzv-endpoint the HOST:PORT of an etcd "
                "client URL (etcd 3.4 or later) that this machine can reach") from None


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _b64(value: str | bytes) -> str:
    return base64.b64encode(_bytes(value)).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)
