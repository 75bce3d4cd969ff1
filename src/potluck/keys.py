"""Every key potluck writes on a job's store, in one place.

Job-level keys live under ``potluck/<run id>/``; the launcher and the workers both name
them from here (the launcher imports nothing else of the worker side):

``potluck/<run>/a<restart>/s<k>/g<n>``  prefix of a static job's group n (restart attempt,
                                        k-th cohort of its processes)
``potluck/<run>/elastic/g<n>``          prefix of an elastic cohort's group n
``potluck/<run>/elastic/failed/g<n>``   a member abandoned generation n's step
``potluck/<run>/rdzv/...``              the rendezvous (below)
``potluck/<run>/process/<host>/<pid>``  member id of worker process pid (elastic)
``potluck/<run>/agents/...``            the launchers' agents meeting each other
``potluck/<run>/status/count``          workers that publish steps for the status page
``potluck/<run>/status/slot/<i>``       the i-th of them (its worker name)
``potluck/<run>/status/w/<worker>``     its latest pulse (JSON: where it is, new steps)

The rendezvous's own keys, relative to its prefix:

``current``                 number of the newest published generation
``g/<n>``                   JSON record of generation n (set once, by compare_set)
``g/<n>/reg/<id>``          id asks to be in generation n (survivors, after a failure)
``g/<n>/b/<k>``             the leader's answer to boundary k of generation n
``leave/<id>``              id announced a graceful departure
``hb/<id>``                 id's last heartbeat (wall-clock seconds)
``join/count``, ``join/<i>`` the join queue: i-th join request is worker id
``adm/<id>/challenge``      nonce the admitter asks id to sign
``adm/<id>/response``       ``<challenge>:<HMAC-SHA256(token, challenge + id), hex>``
``adm/<id>/verdict``        ``admitted:<n>`` or ``refused:<reason>``
``founder``                 the worker that forms generation 0
``finished``                the run is complete (set by its members): joiners stop waiting
``out/<id>``                id was a member and generation n went on without it (n)
"""

from __future__ import annotations

import socket


def static_group(run_id: str, restart: int, generation: int, session: int = 0) -> str:
    """Prefix of a static job's process group: a restarted job never reuses keys, nor
    does a process's next cohort (``session``: a second ``init()`` after ``close()``)."""
    return f"potluck/{run_id}/a{restart}/s{session}/g{generation}"


def elastic_root(run_id: str) -> str:
    return f"potluck/{run_id}/elastic"


def elastic_group(root: str, generation: int) -> str:
    """Prefix of an elastic cohort's group of ``generation`` under ``root``."""
    return f"{root}/g{generation}"


def step_failed(root: str, generation: int) -> str:
    """Set by a member that abandoned ``generation``'s step (see ``FailureWatch``)."""
    return f"{root}/failed/g{generation}"


def rendezvous_root(run_id: str) -> str:
    return f"potluck/{run_id}/rdzv"


def process(run_id: str, pid: int, host: str | None = None) -> str:
    """Where an elastic worker writes its member id, so its agent can report its death."""
    return f"potluck/{run_id}/process/{host or socket.gethostname()}/{pid}"


def status_count(run_id: str) -> str:
    return f"potluck/{run_id}/status/count"


def status_slot(run_id: str, slot: int) -> str:
    return f"potluck/{run_id}/status/slot/{slot}"


def status_pulse(run_id: str, worker: str) -> str:
    """A worker's latest pulse for the status page (``potluck.metrics.publisher``)."""
    return f"potluck/{run_id}/status/w/{worker}"


def link_probe(run_id: str, worker: str) -> str:
    """The blob a member writes and reads back to time its link (``potluck.population``)."""
    return f"potluck/{run_id}/probe/{worker}"


def agents(run_id: str, name: str) -> str:
    """The launchers' agents: ``started``, ``done``, ``attempt<k>`` ..."""
    return f"potluck/{run_id}/agents/{name}"


def successor_count(run_id: str) -> str:
    """How many agents published a successor socket (``succession.publish``)."""
    return f"potluck/{run_id}/successor/count"


def successor(run_id: str, slot: int) -> str:
    """An agent's successor socket: "node host port"."""
    return f"potluck/{run_id}/successor/{slot}"


CURRENT = "current"
FOUNDER = "founder"  # the first joiner to claim it forms generation 0
JOIN_COUNT = "join/count"
FINISHED = "finished"
ADMITTED = "admitted:"  # a verdict's value starts so for an admitted worker


def generation(n: int) -> str:
    return f"g/{n}"


def registration(n: int, worker_id: str) -> str:
    return f"g/{n}/reg/{worker_id}"


def boundary(n: int, k: int) -> str:
    return f"g/{n}/b/{k}"


def leave(worker_id: str) -> str:
    return f"leave/{worker_id}"


def seat(worker_id: str) -> str:
    """Where a joiner runs (host, node and local rank): what a restart keeps."""
    return f"seat/{worker_id}"


def ban(seat_name: str) -> str:
    """Set when a member was quarantined (``potluck.trust``): its seat is refused."""
    return f"ban/{seat_name}"


def left_out(worker_id: str) -> str:
    """Set when a published generation no longer lists ``worker_id`` (the agent ends a
    process that was left out without leaving: frozen, or cut off)."""
    return f"out/{worker_id}"


def heartbeat(worker_id: str) -> str:
    return f"hb/{worker_id}"


def join_slot(i: int) -> str:
    return f"join/{i}"


def challenge(worker_id: str) -> str:
    return f"adm/{worker_id}/challenge"


def response(worker_id: str) -> str:
    return f"adm/{worker_id}/response"


def verdict(worker_id: str) -> str:
    return f"adm/{worker_id}/verdict"
