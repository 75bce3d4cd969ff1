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
until every node's workers are done with it). An elastic job's agents do not meet per
attempt: each is on the job's roll (``Presence``) and beats while it runs, so at the end
node 0 waits only for the agents still beating (``wait_for_roll``). Waits poll in short
slices so that a signal to the launcher is handled within a fraction of a second.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from potluck import keys
from potluck.errors import ConfigError, RendezvousError
from potluck.launch.config import LaunchConfig
from potluck.launch.moved import moved_to, remember
from potluck.launch.policy import CohortView, roll_call
from potluck.succession import Candidate, Succession, publish

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store, TCPStore

    from potluck.etcd_store import EtcdStore

_SLICE = 2.0  # seconds per connection try, so signals are seen between tries
_BACKLOG = 1024  # connections that may wait while node 0 imports torch
AGENT_BEAT = 1.0  # seconds between an elastic agent's heartbeats
AGENT_LOST = 5.0  # an agent whose last beat is older is gone (killed, or cut off)
# Node 0 waits for the roll from its own workers' end, which in a run that lost them
# early is most of the run: ask about the agents still on it 4 times a second.
_ROLL_POLL = 0.25
# A wait for node 0 or the other nodes says what it waits for: first after this many
# seconds (a healthy start is quicker), then every REPORT_EVERY seconds.
FIRST_REPORT = 5.0
REPORT_EVERY = 10.0

Say = Callable[[str], None]


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
        self._successor = successor_socket() if successors else None
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


def successor_socket() -> socket.socket:
    """An agent's successor socket: listening from its start, on a free port."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True,
                                    backlog=_BACKLOG)
    return socket.create_server(("0.0.0.0", 0), backlog=_BACKLOG)


def advertised_host(config: LaunchConfig) -> str:
    """This machine's address on the route to node 0 (what the other nodes can dial)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((config.master_addr, config.port_to_host() or 1))
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()


def clear_worker_keys(store: Store) -> int:
    """Delete every key of the store that is not potluck's (``potluck/...``, each named
    with its attempt where an attempt must not see another's): what a restarted
    attempt's plain torch workers would otherwise read. torch's ``env://`` rendezvous
    on the agent's store writes its group's keys with no attempt in them (torchrun
    gives every attempt a new store), so an attempt's Gloo group read the previous
    attempt's addresses and hung or failed. Node 0 calls it before an attempt's
    workers start on any node. Returns how many keys it deleted."""
    deleted = 0
    for key in store.list_keys():  # type: ignore[attr-defined]
        if not key.startswith("potluck/"):
            deleted += bool(store.delete_key(key))
    return deleted


def holds_torch_keys(store: Store) -> bool:
    """Whether a key that is not potluck's is on the store: a worker formed a plain
    torch.distributed group on it (torch's ``env://`` rendezvous with the agent's
    store writes its group's addresses there)."""
    return any(not key.startswith("potluck/")
               for key in store.list_keys())  # type: ignore[attr-defined]


def clear_for_whole_restart(store: Store, run_id: str) -> int:
    """Before an elastic job's whole worker set restarts (no cohort ever formed): delete
    every key its workers wrote, torch's (``clear_worker_keys``) and the cohort's
    (a half-joined rendezvous would hold the restarted workers waiting for a founder
    that is gone). The agents' and the status page's keys stay. Returns how many keys
    it deleted."""
    keep = (keys.agents(run_id, ""), keys.status_count(run_id).removesuffix("count"))
    deleted = 0
    for key in store.list_keys():  # type: ignore[attr-defined]
        if not key.startswith(keep):
            deleted += bool(store.delete_key(key))
    return deleted


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
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6,
                                        dualstack_ipv6=True, backlog=_BACKLOG)
        return socket.create_server(("0.0.0.0", port), backlog=_BACKLOG)
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
    reports = _Reports(say)

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
            last = _first_line(exc)
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
        "sees it"
    )


def waiting_for_store(node_rank: int, where: str, waited: float, timeout: float,
                      last: str) -> str:
    """What a node other than 0 says while node 0's store does not answer."""
    return (f"potluck run: node {node_rank} is waiting for node 0's store at {where} "
            f"({waited:.0f} s of --join-timeout {timeout:g} s; last try: {last}): start "
            "node 0's `potluck run` if it is not running, and check --master-addr and "
            "--master-port (node 0's address and port as this node sees them)")


def waiting_for_nodes(node_rank: int, arrived: int, wanted: int, waited: float,
                      timeout: float) -> str:
    """What an agent says while the other nodes' agents have not all met it."""
    return (f"potluck run: node {node_rank} is waiting for the other nodes: {arrived} of "
            f"{wanted} node agents have met on the store ({waited:.0f} s of --join-timeout "
            f"{timeout:g} s): start `potluck run` on every node with the same --nnodes, "
            "--master-addr, --master-port and --run-id, and a --node-rank of its own")


def report_due(waited: float, said: int, *, first: float = FIRST_REPORT,
               every: float = REPORT_EVERY) -> bool:
    """Whether a wait of ``waited`` seconds that reported ``said`` times reports again:
    at ``first`` seconds, then every ``every`` seconds."""
    return waited >= first + said * every


class _Reports:
    """A waiting loop's reports: each try calls it with the line to say, which is said
    when ``report_due`` (never when ``say`` is None)."""

    def __init__(self, say: Say | None) -> None:
        self._say, self._started, self._said = say, time.monotonic(), 0

    def __call__(self, line: Callable[[float], str]) -> None:
        waited = time.monotonic() - self._started
        if self._say is not None and report_due(waited, self._said, first=FIRST_REPORT,
                                                every=REPORT_EVERY):
            self._said += 1
            self._say(line(waited))


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


def meet(
    store: Store,
    key: str,
    count: int,
    timeout: float,
    stopping: Callable[[], bool],
    *,
    say: Say | None = None,
    node_rank: int = 0,
) -> None:
    """Count this agent in at ``key``; return when ``count`` agents have, else raise.
    ``say`` hears every few seconds how many have come (``waiting_for_nodes``)."""
    check_in(store, key)
    reports = _Reports(say)

    def report(arrived: int, wanted: int) -> None:
        reports(lambda waited: waiting_for_nodes(node_rank, arrived, wanted, waited, timeout))

    wait_for_count(store, key, lambda: count, timeout, stopping, report=report,
                   fix="start `potluck run` on every node with the same --nnodes, "
                       "--master-addr, --master-port and --run-id")


def check_in(store: Store, key: str) -> None:
    """Count this agent in at ``key`` without waiting for the others."""
    _count(store, key, 1)


def wait_for_count(store: Store, key: str, target: Callable[[], int], timeout: float,
                   stopping: Callable[[], bool], *,
                   fix: str = "a node's workers are still running or its agent hangs: "
                              "see that node's output",
                   report: Callable[[int, int], None] = lambda arrived, wanted: None,
                   ) -> None:
    """Wait until ``key``'s count reaches ``target()`` (re-read: it may grow), or raise
    naming ``fix``; ``report(arrived, wanted)`` hears each look that fell short."""
    deadline = time.monotonic() + timeout
    while (arrived := _count(store, key)) < (wanted := target()):
        if stopping():
            return
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"only {arrived} of {wanted} node agents reached {key!r} within "
                f"{timeout:g} s; {fix}"
            )
        report(arrived, wanted)
        time.sleep(0.05)


def count(store: Store, key: str) -> int:
    """The count at ``key`` (0 if nobody checked in yet)."""
    return _count(store, key)


def _count(store: Store, key: str, add: int = 0) -> int:
    try:
        return int(store.add(key, add))
    except RuntimeError as exc:
        raise RendezvousError(
            f"lost the store while waiting at {key!r} ({_first_line(exc)}); node 0's "
            "`potluck run` exited or the network to it failed: see node 0's report"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def joined_cohort(store: Store, run_id: str, pid: int) -> bool:
    """Whether worker process ``pid`` joined the elastic cohort (``potluck.init()``
    writes its member id under ``keys.process``)."""
    return store.check([keys.process(run_id, pid)])


def cohort_formed(store: Store, run_id: str) -> bool:
    """Whether any generation of the elastic cohort was ever published."""
    return store.check([_rendezvous(run_id, keys.CURRENT)])


def mark_exited(store: Store, run_id: str, pid: int) -> None:
    """The agent saw worker process ``pid`` die: count it out of the elastic cohort now.

    Its member id (written by the worker under ``keys.process``) gets a leave key, so the
    survivors' next generation forms without waiting for its heartbeat to go stale. A
    process that never joined (or a static job) is ignored.
    """
    key = keys.process(run_id, pid)
    if store.check([key]):
        worker_id = store.get(key).decode()
        store.set(_rendezvous(run_id, keys.leave(worker_id)), "exited")


def view_worker(store: Store, run_id: str, pid: int, worker_id: str | None) -> CohortView:
    """What the store says about elastic worker process ``pid`` (``worker_id``: its id if
    already known, which saves a read)."""
    if worker_id is None:
        key = keys.process(run_id, pid)
        if not store.check([key]):
            return CohortView(None)
        worker_id = store.get(key).decode()
    verdict = _rendezvous(run_id, keys.verdict(worker_id))
    return CohortView(
        worker_id,
        left_out=store.check([_rendezvous(run_id, keys.left_out(worker_id))]),
        left=store.check([_rendezvous(run_id, keys.leave(worker_id))]),
        admitted=store.check([verdict]) and store.get(verdict).decode().startswith(keys.ADMITTED),
    )


def run_finished(store: Store, run_id: str) -> bool:
    return store.check([_rendezvous(run_id, keys.FINISHED)])


def _rendezvous(run_id: str, key: str) -> str:
    """A rendezvous key (``keys``, relative to its prefix) as the agents' store has it."""
    return f"{keys.rendezvous_root(run_id)}/{key}"


def exchange_nprocs(store: Store, key: str, config: LaunchConfig,
                    stopping: Callable[[], bool], *, say: Say | None = None) -> list[int]:
    """Meet the other nodes' agents at ``key`` (one attempt), each telling its worker
    count; returns every node's count in node rank order. Two agents started with the
    same ``--node-rank`` are refused at once (their ranks would collide). ``say`` hears
    every few seconds how many have come."""
    node = config.node_rank
    if _count(store, f"{key}/node{node}", 1) > 1:
        raise ConfigError(
            f"another node's `potluck run` already started with --node-rank {node} for "
            f"this job (--run-id {config.run_id}): give every node its own --node-rank, "
            f"0..{config.nnodes - 1}"
        )
    store.set(f"{key}/nproc{node}", str(config.nproc_per_node))
    meet(store, key, config.nnodes, config.join_timeout, stopping, say=say,
         node_rank=node)
    return [int(store.get(f"{key}/nproc{r}").decode()) for r in range(config.nnodes)]


def publish_first_node(store: Store, config: LaunchConfig) -> None:
    """Node 0 of an elastic job: its worker count, which its ranks 0.. occupy."""
    store.set(keys.agents(config.run_id, "nproc0"), str(config.nproc_per_node))


def elastic_offset(store: Store, config: LaunchConfig, stopping: Callable[[], bool], *,
                   say: Say | None = None) -> int:
    """A later node of an elastic job: the launch rank of its local rank 0, after node
    0's workers and every node that asked before it. A founding node (one of
    ``--nnodes MIN:MAX``'s first MIN) must run node 0's worker count: the cohort's first
    generation waits for exactly MIN nodes' worth of workers. ``say`` hears every few
    seconds that node 0 has not said its count yet."""
    key = keys.agents(config.run_id, "nproc0")
    deadline = time.monotonic() + config.join_timeout
    reports = _Reports(say)
    try:
        while not store.check([key]):
            if stopping() or time.monotonic() > deadline:
                raise RendezvousError(f"node 0 did not say how many workers it runs within "
                                      f"{config.join_timeout:g} s; see node 0's output")
            reports(lambda waited: (
                f"potluck run: node {config.node_rank} reached node 0's store at "
                f"{config.master_addr} and is waiting for node 0 to start its workers "
                f"({waited:.0f} s of --join-timeout {config.join_timeout:g} s); see node "
                "0's output"))
            time.sleep(0.05)
        first = int(store.get(key).decode())
    except RuntimeError as exc:  # node 0 closed the store: its job ended, or it died
        raise RendezvousError(
            f"lost node 0's store at {config.master_addr} ({_first_line(exc)}): node 0's "
            "`potluck run` exited (its job may have finished already) or the network to "
            "it failed; see node 0's output"
        ) from exc
    founding = config.min_nodes if config.min_nodes is not None else config.nnodes
    if config.node_rank < founding and first != config.nproc_per_node:
        raise ConfigError(
            f"--nproc-per-node {config.nproc_per_node} on node {config.node_rank}, but node "
            f"0 runs {first}: the {founding} founding node(s) of --nnodes "
            f"{founding}:{config.nnodes} must run the same number of workers (the first "
            "generation waits for that many); nodes that join later may run any number"
        )
    taken = _count(store, keys.agents(config.run_id, "slots"), config.nproc_per_node)
    return first + taken - config.nproc_per_node


class Presence:
    """This agent on the roll of an elastic job's agents, from its check-in to its
    check-out, with a heartbeat on a thread of its own in between (every ``AGENT_BEAT``
    s). Node 0 (or the agent the store moved to) keeps the store up for the agents on
    the roll (``wait_for_roll``); on a store that moved, each agent writes its place on
    the roll back."""

    def __init__(self, store: Store, config: LaunchConfig) -> None:
        from potluck.relay import prefixed, succession_of
        from potluck.rendezvous.heartbeat import Heartbeat

        self._store, self._run_id, self._done = store, config.run_id, False
        self.index = _count(store, keys.agents(config.run_id, "started"), 1) - 1
        self._who = f"node {config.node_rank} (host {socket.gethostname()})"
        store.set(_roll(config.run_id, f"who/{self.index}"), self._who)
        self._beat = Heartbeat(agent_beats(store, config.run_id), f"agent{self.index}",
                               AGENT_BEAT).start()
        # and where the cohort's quorum reads it: this node is on this store's side
        self._node_beat = Heartbeat(prefixed(store, keys.rendezvous_root(config.run_id)),
                                    f"node{config.node_rank}", AGENT_BEAT).start()
        succession = succession_of(store)
        if succession is not None:
            succession.seeder(self._seed)

    def _seed(self, root: Store) -> None:
        """The store moved: this agent's place on the roll, written back (the count of
        agents raised to cover it; an agent lost with the old host has no beat there,
        and the roll counts it lost)."""
        started = keys.agents(self._run_id, "started")
        have = int(root.add(started, 0))
        while have < self.index + 1:
            have = int(root.compare_set(started, str(have), str(self.index + 1)).decode())
        root.set(_roll(self._run_id, f"who/{self.index}"), self._who)
        if self._done:  # (checked out before the move: not to be waited for, nor lost)
            root.set(_roll(self._run_id, f"done/{self.index}"), "1")

    def check_out(self) -> None:
        """Done with the store: stop beating, then say so (node 0 may be gone already:
        this node's outcome stands)."""
        self._beat.stop()
        self._node_beat.stop()
        self._done = True
        with contextlib.suppress(RuntimeError):
            self._store.set(_roll(self._run_id, f"done/{self.index}"), "1")


def wait_for_roll(store: Store, run_id: str, timeout: float, stopping: Callable[[], bool],
                  lost: Callable[[str, float], None]) -> None:
    """Node 0 of an elastic job: wait until every agent on the roll checked out, or
    stopped beating (its node was killed or cut off: it will never check out, and the
    cohort went on without its workers). ``lost(who, silent_s)`` is told of each such
    node once. Raises ``RendezvousError`` at ``timeout`` naming how many are left."""
    from potluck.rendezvous.heartbeat import read_beats

    deadline = time.monotonic() + timeout
    told: set[int] = set()
    done: set[int] = set()  # (an agent checks out once: never asked again)
    beats_store = agent_beats(store, run_id)
    # (beat value, when it changed on this node's clock): beats are other hosts' wall
    # clocks, so only their change is compared, never their value (no clock skew)
    changed: dict[int, tuple[float | None, float]] = {}
    read: dict[str, float] = {}
    looked = -float("inf")  # when the beats were last read
    while True:
        agents = range(count(store, keys.agents(run_id, "started")))
        done |= {a for a in agents
                 if a not in done and store.check([_roll(run_id, f"done/{a}")])}
        pending = [a for a in agents if a not in done]
        now = time.monotonic()
        if now - looked >= AGENT_BEAT / 2:  # (a beat changes once every AGENT_BEAT)
            read, looked = read_beats(beats_store, [f"agent{a}" for a in pending]), now
        for agent in pending:
            # (no beat at all: on a store that moved, an agent lost with the old host;
            # a live one beats within AGENT_BEAT of its check-in)
            beat = read.get(f"agent{agent}")
            if agent not in changed or changed[agent][0] != beat:
                changed[agent] = (beat, now)
        beats = {a: when for a, (_, when) in changed.items()}
        call = roll_call(pending, beats, now=now, timeout=AGENT_LOST)
        for agent in call.lost:
            if agent not in told:
                told.add(agent)
                who = _roll(run_id, f"who/{agent}")
                lost(store.get(who).decode() if store.check([who]) else f"agent {agent}",
                     now - beats[agent])
        if not call.waiting or stopping():
            return
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"{len(call.waiting)} of {len(agents)} node agents did not check out within "
                f"{timeout:g} s, and they still beat: a node's workers are still running or "
                "its agent hangs: see that node's output")
        time.sleep(_ROLL_POLL)


def _roll(run_id: str, name: str) -> str:
    return keys.agents(run_id, f"roll/{name}")


def agent_beats(store: Store, run_id: str) -> Store:
    """The agents' heartbeats (``hb/agent<i>``) live under the roll."""
    from potluck.relay import prefixed

    return prefixed(store, _roll(run_id, "beats"))
