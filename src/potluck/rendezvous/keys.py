"""The rendezvous's store keys, in one place (all under the rendezvous prefix).

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
``finished``                the run is complete (set by its members): joiners stop waiting
"""

from __future__ import annotations

CURRENT = "current"
JOIN_COUNT = "join/count"
FINISHED = "finished"


def generation(n: int) -> str:
    return f"g/{n}"


def registration(n: int, worker_id: str) -> str:
    return f"g/{n}/reg/{worker_id}"


def boundary(n: int, k: int) -> str:
    return f"g/{n}/b/{k}"


def leave(worker_id: str) -> str:
    return f"leave/{worker_id}"


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
