"""Hosts on one machine: network namespaces joined by a veth pair (rate-limited), or
by a switch.

    with LinkedHosts("pl-wan") as hosts:       # 10.77.<k>.1 and .2, no limit yet
        hosts.limit("10mbit")                   # tc tbf on both ends: each direction
        hosts.command(0, ["python", ...])       # ["ip", "netns", "exec", ns0, ...]
        hosts.tx_bytes(0)                        # what host 0's end has sent

    with BridgedHosts(3) as hosts:             # 10.78.<k>.1, .2, .3 on one switch
        hosts.cut(0)                            # host 0's port down: it reaches nobody
        hosts.split([2, 3])                     # 2 and 3 on a switch of their own
        hosts.limit("20mbit", [1])              # host 1's uplink and downlink

For the WAN bench and tests (root and iproute2; ``unavailable()`` says why not). Each
namespace is a host with its own address; the veth between them is the only link, so
its counters count every byte the job put on the wire (headers included). ``tc ... tbf``
caps each end's egress (netem, for delay, is not available on these machines).
Deleting a namespace deletes its end of the veth, so ``close`` leaves nothing behind.
While the hosts are open, a SIGTERM (where nobody else handles it) exits the process
through ``close`` as an exception would, instead of killing it with the namespaces still
there (a bench stopped with ``kill`` used to leave them for good).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from potluck.errors import PotluckError


class NetnsError(PotluckError):
    """A namespace, link or qdisc could not be made; the message has ip's or tc's words."""


def unavailable(tools: Sequence[str] = ("ip", "tc")) -> str | None:
    """Why namespaces (linked by ``tools``) cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in tools:
        if shutil.which(tool) is None:
            return f"needs iproute2's `{tool}`"
    return None


def tbf_args(device: str, rate: str, burst: str = "64kb", latency: str = "500ms") -> list[str]:
    """``tc`` arguments capping ``device``'s egress at ``rate`` (e.g. "10mbit")."""
    return ["qdisc", "replace", "dev", device, "root", "tbf", "rate", rate, "burst", burst,
            "latency", latency]


def _run(*args: str) -> str:
    try:
        done = subprocess.run(list(args), check=True, capture_output=True, text=True,
                              timeout=15)
    except subprocess.CalledProcessError as exc:
        raise NetnsError(f"`{' '.join(args)}` failed: {exc.stderr.strip()}") from exc
    return done.stdout


def _exit_on_sigterm() -> Any:
    """Make SIGTERM raise ``SystemExit`` (so ``finally`` and ``with`` clean up) if it
    still has its default action and this is the main thread; the handler it replaced,
    or None if it left SIGTERM alone (another ``LinkedHosts`` open already set it)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        return None
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    return previous


def _deferred(previous: Any) -> Any:
    """While ``close`` deletes the namespaces, a second SIGTERM waits (it would stop the
    deletion halfway); returns what to restore, or None where nothing was deferred."""
    if previous is None or threading.current_thread() is not threading.main_thread():
        return None
    caught: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))
    return caught


class _Namespaces:
    """Namespaces made by ``open`` and deleted by ``close`` (a ``with`` block), whatever
    happens; a SIGTERM meanwhile exits through ``close``."""

    def __init__(self) -> None:
        self._created: list[str] = []
        self._sigterm: Any = None  # the handler ours replaced while open (None: none)

    def _build(self) -> None:
        raise NotImplementedError

    def _add(self, name: str) -> None:
        self._created.append(name)  # first: a SIGTERM right after the add
        _run("ip", "netns", "add", name)  # must still find it to delete

    def open(self) -> Self:
        self._sigterm = _exit_on_sigterm()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        caught = _deferred(self._sigterm)
        for name in self._created:  # (one never added: ip says so, nothing happens)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=15)
        self._created = []
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
            if caught:  # a SIGTERM came while deleting: its default action now
                signal.raise_signal(signal.SIGTERM)

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


class LinkedHosts(_Namespaces):
    """Two namespaces ``<prefix>-<tag>-0/1`` with addresses ``10.77.<k>.1/.2``."""

    def __init__(self, prefix: str = "pl-link") -> None:
        super().__init__()
        tag = f"{os.getpid() % 10000}-{random.randrange(1000)}"
        subnet = random.randrange(1, 250)
        self.names = (f"{prefix}-{tag}-0", f"{prefix}-{tag}-1")
        self.addresses = (f"10.77.{subnet}.1", f"10.77.{subnet}.2")
        self.devices = (f"plv{tag}a"[:15], f"plv{tag}b"[:15])

    def _build(self) -> None:
        for name in self.names:
            self._add(name)
        _run("ip", "link", "add", self.devices[0], "netns", self.names[0], "type", "veth",
             "peer", "name", self.devices[1], "netns", self.names[1])
        for name, dev, addr in zip(self.names, self.devices, self.addresses, strict=True):
            _up(name, dev, addr)

    def limit(self, rate: str | None) -> None:
        """Cap both directions at ``rate`` (None: take the cap off)."""
        for name, dev in zip(self.names, self.devices, strict=True):
            if rate is None:
                subprocess.run(["tc", "-n", name, "qdisc", "del", "dev", dev, "root"],
                               capture_output=True, timeout=15)
            else:
                _run("tc", "-n", name, *tbf_args(dev, rate))

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside host ``host``'s namespace."""
        return ["ip", "netns", "exec", self.names[host], *argv]

    def tx_bytes(self, host: int) -> int:
        """Bytes host ``host``'s end of the veth has sent (its counter, headers included)."""
        out = _run("ip", "-n", self.names[host], "-j", "-s", "link", "show", "dev",
                   self.devices[host])
        return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])


class BridgedHosts(_Namespaces):
    """``count`` hosts ``<prefix>-<tag>-<i>`` (``10.78.<k>.<i+1>``), each on a veth to a
    bridge in a hub namespace ``<prefix>-<tag>-hub``: a switch whose ports can be cut
    (``cut``) or split into islands (``split``), for tests of a lost or partitioned host.
    A cut or split link drops packets silently, as a pulled cable does."""

    def __init__(self, count: int, prefix: str = "pl-hub") -> None:
        super().__init__()
        if not 2 <= count <= 9:
            raise ValueError(f"BridgedHosts(count={count}): from 2 to 9 hosts")
        tag = f"{os.getpid() % 10000}-{random.randrange(1000)}"
        subnet = random.randrange(1, 250)
        self.hub = f"{prefix}-{tag}-hub"
        self.names = tuple(f"{prefix}-{tag}-{i}" for i in range(count))
        self.addresses = tuple(f"10.78.{subnet}.{i + 1}" for i in range(count))
        self.devices = tuple(f"plh{tag}{i}"[:15] for i in range(count))  # in the hosts
        self.ports = tuple(f"plp{tag}{i}"[:15] for i in range(count))  # in the hub
        self._islands = 0

    def _build(self) -> None:
        self._add(self.hub)
        _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.hub, "link", "set", "br0", "up")
        for name, dev, port, addr in zip(self.names, self.devices, self.ports,
                                         self.addresses, strict=True):
            self._add(name)
            _run("ip", "link", "add", dev, "netns", name, "type", "veth",
                 "peer", "name", port, "netns", self.hub)
            _run("ip", "-n", self.hub, "link", "set", port, "master", "br0")
            _run("ip", "-n", self.hub, "link", "set", port, "up")
            _up(name, dev, addr)

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside host ``host``'s namespace."""
        return ["ip", "netns", "exec", self.names[host], *argv]

    def limit(self, rate: str | None, hosts: Sequence[int] | None = None) -> None:
        """Cap each of ``hosts`` (default: all) at ``rate`` both ways: its own end's
        egress (its uplink) and its port's on the switch (its downlink); None: no cap."""
        for host in range(len(self.names)) if hosts is None else hosts:
            for namespace, device in ((self.names[host], self.devices[host]),
                                      (self.hub, self.ports[host])):
                if rate is None:
                    subprocess.run(["tc", "-n", namespace, "qdisc", "del", "dev", device,
                                    "root"], capture_output=True, timeout=15)
                else:
                    _run("tc", "-n", namespace, *tbf_args(device, rate))

    def link_bytes(self, host: int) -> tuple[int, int]:
        """Bytes host ``host`` has sent and received on its link (headers included)."""
        out = _run("ip", "-n", self.names[host], "-j", "-s", "link", "show", "dev",
                   self.devices[host])
        stats = json.loads(out)[0]["stats64"]
        return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])

    def cut(self, host: int) -> None:
        """Take host ``host``'s port on the switch down: it reaches nobody, nobody it."""
        _run("ip", "-n", self.hub, "link", "set", self.ports[host], "down")

    def mend(self, host: int) -> None:
        """Bring host ``host``'s port on the switch up again (after ``cut``)."""
        _run("ip", "-n", self.hub, "link", "set", self.ports[host], "up")

    def split(self, island: Sequence[int]) -> None:
        """Move the hosts ``island`` to a bridge of their own: they reach each other
        only, the others each other only."""
        self._islands += 1
        bridge = f"br{self._islands}"
        _run("ip", "-n", self.hub, "link", "add", bridge, "type", "bridge")
        _run("ip", "-n", self.hub, "link", "set", bridge, "up")
        for host in island:
            _run("ip", "-n", self.hub, "link", "set", self.ports[host], "master", bridge)


def _up(namespace: str, device: str, address: str) -> None:
    """Loopback and ``device`` up in ``namespace``, ``device`` at ``address``/24."""
    _run("ip", "-n", namespace, "link", "set", "lo", "up")
    _run("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", device)
    _run("ip", "-n", namespace, "link", "set", device, "up")
