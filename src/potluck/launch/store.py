"""The agents' side of the job's ``TCPStore``: node 0 hosts it, the other nodes wait.

Node 0 binds the store's listening socket first (``JobStore``), without importing torch,
starts its workers, and only then imports torch and serves on that socket: the
launcher's import overlaps the workers' own, and a worker that connects early waits in
the socket's backlog. That is about a second less start-up on a small machine.

Under ``--rdzv-backend etcd`` no agent hosts it: every agent (node 0's too) is a client
of the ``EtcdStore`` at ``--rdzv-endpoint``, and so is every worker.

The store lives in the agent of node rank 0, not in a worker, so a worker's death never
takes the rendezvous with it. Agents also meet on it: once per attempt (so every node
starts the same attempt together) and once at the end (so node 0 keeps the store up
until every node's workers are done with it: ``meeting.py``). An elastic job's agents
do not meet per attempt: each is on the job's roll (``roll.py``). Waits poll in short
slices so that a signal to the launcher is handled within a fraction of a second.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from potluck import keys
from potluck.errors import ConfigError, RendezvousError
from potluck.launch.config import LaunchConfig
from potluck.launch.meeting import Reports, Say, first_line
from potluck.launch.moved import moved_to, remember
from potluck.launch.roll import AGENT_BEAT
from potluck.succession import Candidate, Succession, publish

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store, TCPStore

    from potluck.etcd_store import EtcdStore

_SLICE = 2.0  # seconds per connection try, so signals are seen between tries
_BACKLOG = 1024  # connections that may wait while node 0 imports torch


class JobStore:
    """The job's store as one agent holds it: ``port`` at once, ``get()`` when needed.

    Node 0 binds the listening socket in the constructor (a port in use is a clear
    error before any worker starts) and serves on it from the first ``get()``; other
    nodes connect to node 0 at their first ``get()``.

    Across nodes of an elastic job the store outlives node 0 (``potluck.succession``):
    every agent binds a successor socket too and publishes it at its first ``get()``,
    which returns a relay; when the store's host is lost the relay moves, and this
    agent serves a store on its successor socket at once (``serving``), in case it is
    the first reachable one.
    """

    def __init__(self, config: LaunchConfig, stopping: Callable[[], bool], *,
                 say: Say | None = None) -> None:
        """``say``: where a node other than 0 tells how its wait for node 0 goes."""
        self._config, self._stopping, self._say = config, stopping, say
        hosted = config.etcd is None  # (under etcd no agent hosts, none succeeds)
        successors = config.elastic and config.nnodes > 1 and hosted
        if successors and config.node_rank == 0:
            refuse_if_moved(config)
        self._listener = listen(config) if config.node_rank == 0 and hosted else None
        self.port = (self._listener.getsockname()[1] if self._listener is not None
                     else config.port_to_host())
        self._store: Store | None = None
        self._etcd: EtcdStore | None = None
        self._successor = successor_socket(config.master_addr) if successors else None
        self._serving: TCPStore | None = None  # the successor store this agent serves
        self.succession: Succession | None = None

    def get(self) -> Store:
        if self._store is None:
            cfg = self._config
            if cfg.etcd is not None:
                self._store = self._etcd_store(cfg.etcd)
                return self._store
            if self._listener is not None:
                client: Store = host_store(cfg, self._listener)
            else:
                client = join_store(cfg, self._stopping, say=self._say)
            self._store = client
            if self._successor is not None:
                self._store = self._relay(client)
        return self._store

    def _etcd_store(self, endpoint: str) -> Store:
        """The job's keys in etcd, behind a relay (a lost connection is one line)."""
        from potluck.etcd_store import EtcdStore, job_prefix
        from potluck.launch.leftovers import refuse_leftovers
        from potluck.relay import RelayStore

        cfg = self._config
        self._etcd = EtcdStore(endpoint, job_prefix(cfg.run_id),
                               timedelta(seconds=cfg.join_timeout))
        store = RelayStore(self._etcd, endpoint)
        if cfg.elastic:
            refuse_leftovers(store, cfg, watch_s=2.5 * AGENT_BEAT)
        return store

    def delete_keys(self) -> int:
        """The job is over: delete its keys from etcd (how many). A hosted store goes
        with its host, so there is nothing to do."""
        return self._etcd.clear() if self._etcd is not None else 0

    def _relay(self, client: Store) -> Store:
        from potluck.relay import RelayStore

        cfg = self._config
        assert self._successor is not None
        where = f"{cfg.master_addr}:{self.port}"
        mine = Candidate(cfg.node_rank, advertised_host(cfg), self._successor.getsockname()[1])
        self.succession = Succession(cfg.run_id, where, serve=self._serve)
        relay = RelayStore(client, where, succession=self.succession)
        self.succession.use(relay)
        publish(relay, cfg.run_id, mine)
        self.succession.seeder(lambda root: publish(root, cfg.run_id, mine))
        self.learn(relay)
        return relay

    def learn(self, store: Store) -> None:
        """Read the store's successors again, and keep them on this machine (a node 0
        started again finds where the store went: ``moved.py``)."""
        if self.succession is not None:
            self.succession.learn(store)
            remember(self._config.run_id, self.succession.candidates)

    def _serve(self) -> None:
        """The store's host is lost: serve one on this agent's successor socket (the
        survivors take the first reachable one)."""
        if self._serving is not None or self._successor is None:
            return
        from torch._C._distributed_c10d import TCPStore

        self._serving = TCPStore(
            "0.0.0.0", self._successor.getsockname()[1], None, True,
            timedelta(seconds=self._config.join_timeout), wait_for_workers=False,
            master_listen_fd=self._successor.detach())
        # A successor's store holds a cohort that already exists: nobody founds one on
        # it (a worker restarted before the members wrote their records back waits to
        # be admitted instead of forming a generation 0 of its own).
        founder = f"{keys.rendezvous_root(self._config.run_id)}/{keys.FOUNDER}"
        self._serving.compare_set(founder, "", MOVED)

    def address(self) -> tuple[str, int, int]:
        """Where the job's store is now, and the node hosting it: node 0's, the
        successor it moved to, or etcd (no node's)."""
        if self._config.etcd is not None:
            host, port = self._config.etcd.rsplit(":", 1)
            return host.strip("[]"), int(port), 0
        if self.succession is not None and self.succession.moves:
            host, port = self.succession.where.rsplit(":", 1)
            return host, int(port), self.succession.node
        return self._config.master_addr, self.port, 0

    @property
    def hosting(self) -> bool:
        """Whether this agent holds the job's store: node 0's, or the one it moved to.
        Under etcd node 0 is the one that deletes the job's keys at the end."""
        if self.succession is not None and self.succession.moves:
            return self.succession.node == self._config.node_rank
        return self._config.node_rank == 0


MOVED = "(the store moved here: the cohort exists)"  # a successor store's founder


def refuse_if_moved(config: LaunchConfig) -> None:
    """Node 0 of a multi-node elastic job, before it hosts a store: if this job's store
    moved to another node while this one was away, joining it is the way in."""
    moved = moved_to(config.run_id, config.node_rank)
    if moved is None:
        return
    raise ConfigError(
        f"job {config.run_id!r} is still running without this node: its store moved to "
        f"node {moved.node} at {moved.where} when node 0 was lost, so node 0 must not "
        "host a second one (its workers would train a cohort of their own). Start this "
        f"node as a late node of the running job: potluck run --elastic --nnodes "
        f"MIN:MAX --node-rank R --master-addr {moved.host} --master-port {moved.port} "
        f"--run-id {config.run_id} ... (R: a node rank no running node has; the cohort "
        "admits its workers at a step boundary)")


def successor_socket(master_addr: str) -> socket.socket:
    """An agent's successor socket: listening from its start, on a free port."""
    return server_socket(master_addr, 0)


def server_socket(master_addr: str, port: int) -> socket.socket:
    """A store's listening socket on every interface: IPv4 only where ``master_addr``
    has no IPv6 address, else dual-stack.

    torch's store server names each peer it accepts, on its one thread, with a reverse
    lookup. A dual-stack socket sees an IPv4 peer as an IPv4-mapped IPv6 address, which
    no hosts file lists, so every accept asked DNS. Where DNS drops a query, that is 5 s
    with the store deaf to everyone: 400 connections took 35 s to serve, not 0.05 s
    (``tests/distributed/test_store_connections.py``)."""
    if socket.has_dualstack_ipv6() and _has_ipv6(master_addr):
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True,
                                    backlog=_BACKLOG)
    return socket.create_server(("0.0.0.0", port), backlog=_BACKLOG)


def _has_ipv6(addr: str) -> bool:
    """Whether ``addr`` names an IPv6 address (a peer may dial it over IPv6)."""
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return True  # (unknown: keep both families)
    return any(family == socket.AF_INET6 for family, *_ in infos)


def advertised_host(config: LaunchConfig) -> str:
    """This machine's address on the route to node 0 (what the other nodes can dial)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((config.master_addr, config.port_to_host() or 1))
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()


def check_local_address(addr: str) -> None:
    """Node 0 hosts the store, so ``--master-addr`` must be one of this machine's own
    addresses (its workers connect there too): refuse one that is not, at once, instead
    of workers retrying a foreign address for torch's 30 minutes. An address is local
    if a socket can be bound to it."""
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # UnicodeError: a name like "not..valid"
        reason = getattr(exc, "strerror", None) or exc
        raise ConfigError(
            f"--master-addr {addr!r} does not resolve ({reason}); give node "
            "0's hostname or IP address as the other nodes see it (on one node leave it out)"
        ) from exc
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind((address[0], 0, *address[2:]))  # (an IPv6 scope id too)
            except OSError:
                continue
            return
    raise ConfigError(
        f"--master-addr {addr!r} is not an address of this machine, but node 0 "
        f"(--node-rank 0) hosts the job's store and its workers connect to it there: on "
        "node 0 give this machine's own hostname or IP as the other nodes see it (on one "
        "node leave --master-addr out)"
    )


def listen(config: LaunchConfig) -> socket.socket:
    """Node 0: the store's listening socket on ``--master-port`` (or a free port)."""
    check_local_address(config.master_addr)
    port = config.port_to_host()
    try:
        return server_socket(config.master_addr, port)
    except OSError as exc:
        raise ConfigError(
            f"cannot host the store on port {port}: {exc.strerror or exc}; another "
            "program (or an earlier job) holds it: pick a free --master-port, or leave it "
            "out on a single node and potluck picks one"
        ) from exc


def host_store(config: LaunchConfig, listener: socket.socket) -> TCPStore:
    """Node 0: the store server on ``listener``, which it takes over (and closes)."""
    from torch._C._distributed_c10d import TCPStore

    port = listener.getsockname()[1]
    return TCPStore(
        "0.0.0.0", port, None, True, timedelta(seconds=config.join_timeout),
        wait_for_workers=False, master_listen_fd=listener.detach(),
    )


def join_store(config: LaunchConfig, stopping: Callable[[], bool], *,
               say: Say | None = None) -> TCPStore:
    """Other nodes: connect to node 0's store, retrying until the join timeout.

    A plain TCP connection is tried first, quietly, until one is accepted (node 0 may
    not have started yet); only then is a ``TCPStore`` client made. So a wrong address
    is one clear message at the join timeout, not torch's retry warnings with C++ stack
    traces every two seconds, and something that answers but is not the store (its
    reply to torch's ping is wrong) fails at once. Meanwhile ``say`` hears every few
    seconds what this node waits for and where (``waiting_for_store``)."""
    from torch._C._distributed_c10d import TCPStore

    port = config.port_to_host()
    deadline = time.monotonic() + config.join_timeout
    where = f"{config.master_addr}:{port}"
    reports = Reports(say)

    def report(why: str) -> None:
        reports(lambda waited: waiting_for_store(config.node_rank, where, waited,
                                                 config.join_timeout, why))

    last: str | None = "stopped"
    while time.monotonic() < deadline and not stopping():
        last = _wait_for_listener(config.master_addr, port, deadline, stopping, report)
        if last is not None:
            break
        try:  # node 0 may still be importing torch: its store serves a moment later
            return TCPStore(config.master_addr, port, None, False, timedelta(seconds=_SLICE),
                            wait_for_workers=False)
        except RuntimeError as exc:
            last = first_line(exc)
            if "Ping failed" in last:  # an answer, but not the store's
                raise RendezvousError(
                    f"node {config.node_rank}: something at {where} accepted the "
                    f"connection but is not a potluck job's store ({last}); check "
                    "--master-addr and --master-port against node 0's `potluck run`"
                ) from exc
            report(last)
    raise RendezvousError(
        f"node {config.node_rank} could not reach the store at {where} within "
        f"{config.join_timeout:g} s ({last}); start node 0's `potluck run` with the same "
        "--master-port, and check that --master-addr is node 0's address as this node "
        "sees it; if node 0 was lost mid-run, the store moved to the node the running "
        "nodes name ('it moved to node N at HOST:PORT'): point --master-addr and "
        "--master-port there"
    )


def waiting_for_store(node_rank: int, where: str, waited: float, timeout: float,
                      last: str) -> str:
    """What a node other than 0 says while node 0's store does not answer."""
    return (f"potluck run: node {node_rank} is waiting for node 0's store at {where} "
            f"({waited:.0f} s of --join-timeout {timeout:g} s; last try: {last}): start "
            "node 0's `potluck run` if it is not running, and check --master-addr and "
            "--master-port (node 0's address and port as this node sees them); if node "
            "0 was lost mid-run, the store moved: every running node printed where "
            "('it moved to node N at HOST:PORT'), and those are this node's --master-addr "
            "and --master-port")


def _wait_for_listener(addr: str, port: int, deadline: float,
                       stopping: Callable[[], bool],
                       report: Callable[[str], None] = lambda why: None) -> str | None:
    """None once something accepts a TCP connection at ``addr:port``; else why not (at
    the deadline, or when stopping). ``report`` hears why each try failed."""
    last = "stopped"
    while time.monotonic() < deadline and not stopping():
        try:
            with socket.create_connection((addr, port), timeout=_SLICE):
                return None
        except OSError as exc:
            last = exc.strerror or str(exc)
        report(last)
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    return last
