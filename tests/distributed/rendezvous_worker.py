"""One worker of the multi-process rendezvous test.

Usage: python rendezvous_worker.py PORT WORKER_ID EXPECTED. Joins generation 0 through
the test's store, reports it under ``test/gen0/<id>``, waits for ``test/go``, then calls
``next_generation`` and reports the result under ``test/gen1/<id>`` (or the error).
"""

import json
import sys
from datetime import timedelta

from torch.distributed import TCPStore

from potluck.errors import RendezvousError
from potluck.rendezvous import Membership, RendezvousConfig, StoreRendezvous

port, worker_id, expected = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
store = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60))
config = RendezvousConfig(token="proc-token", heartbeat_interval=0.1, heartbeat_timeout=1.0,
                          settle_timeout=10.0, join_timeout=30.0, expected=expected)
rdzv = StoreRendezvous(store, worker_id, config)


def report(key: str, m: Membership) -> None:
    store.set(key, json.dumps({"generation": m.generation, "members": m.members,
                               "rank": m.rank, "leader": m.leader}))


report(f"test/gen0/{worker_id}", rdzv.join())
store.wait(["test/go"], timedelta(seconds=60))
try:
    report(f"test/gen1/{worker_id}", rdzv.next_generation("peer lost"))
except RendezvousError as exc:
    store.set(f"test/gen1/{worker_id}", json.dumps({"error": str(exc)}))
rdzv.close()
