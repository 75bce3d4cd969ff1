"""One rank of the fault tests: join, then run barriers until a peer is lost.

Usage: python fault_worker.py RANK WORLD_SIZE PORT TIMEOUT. The test process hosts the
store (as a launcher's agent would). On the typed error the rank prints one JSON line
(error type, time, rank, generation) and exits 0; any other ending is a failure.
"""

import json
import sys
import time

import torch

import potluck
from potluck.env import WorkerEnv

torch.set_num_threads(1)
rank, world_size, port, timeout = map(float, sys.argv[1:5])
env = WorkerEnv(
    rank=int(rank), world_size=int(world_size), local_world_size=int(world_size),
    master_addr="127.0.0.1", master_port=int(port), agent_store=True, run_id="faults",
)
cohort = potluck.init(timeout=timeout, env=env)
cohort.barrier()
print(json.dumps({"ready": cohort.rank}), flush=True)
try:
    while True:
        cohort.all_reduce_sum(torch.ones(1000))
        time.sleep(0.01)
except potluck.PeerLostError as exc:
    print(json.dumps({"error": type(exc).__name__, "at": time.time(), "rank": exc.rank,
                      "generation": exc.generation, "cause": exc.cause[:200]}), flush=True)
cohort.close()  # a clean exit: the retired group is already torn down
