"""Two hosts on one machine: network namespaces joined by a veth pair, rate-limited.

    with LinkedHosts("pl-wan") as hosts:       # 10.77.<k>.1 and .2, no limit yet
        hosts.limit("10mbit")                   # tc tbf on both ends: each direction
        hosts.command(0, ["python", ...])       # ["ip", "netns", "exec", ns0, ...]
        hosts.tx_bytes(0)                        # what host 0's end has sent

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
from typing import Any

from potluck.errors import PotluckError


class NetnsError(PotluckError):
    """A namespace, link or qdisc could not be made; the message has ip's or tc's words."""


def unavailable() -> str | None:
    """Why two namespaces cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
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


class LinkedHosts:
    """Two namespaces ``<prefix>-<tag>-0/1`` with addresses ``10.77.<k>.1/.2``."""

    def __init__(self, prefix: str = "pl-link") -> None:
        tag = f"{os.getpid() % 10000}-{random.randrange(1000)}"
        subnet = random.randrange(1, 250)
        self.names = (f"{prefix}-{tag}-0", f"{prefix}-{tag}-1")
        self.addresses = (f"10.77.{subnet}.1", f"10.77.{subnet}.2")
        self.devices = (f"plv{tag}a"[:15], f"plv{tag}b"[:15])
        self._created: list[str] = []
        self._sigterm: Any = None  # the handler ours replaced while open (None: none)

    def open(self) -> LinkedHosts:
        self._sigterm = _exit_on_sigterm()
        try:
            for name in self.names:
                self._created.append(name)  # first: a SIGTERM right after the add
                _run("ip", "netns", "add", name)  # must still find it to delete
            _run("ip", "link", "add", self.devices[0], "netns", self.names[0], "type", "veth",
                 "peer", "name", self.devices[1], "netns", self.names[1])
            for name, dev, addr in zip(self.names, self.devices, self.addresses, strict=True):
                _run("ip", "-n", name, "link", "set", "lo", "up")
                _run("ip", "-n", name, "addr", "add", f"{addr}/24", "dev", dev)
                _run("ip", "-n", name, "link", "set", dev, "up")
        except BaseException:
            self.close()
            raise
        return self

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

    def __enter__(self) -> LinkedHosts:
        return self.open()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
