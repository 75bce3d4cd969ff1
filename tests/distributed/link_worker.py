"""One worker of the link-down test, run inside its own network namespace.

Usage: python -m tests.distributed.link_worker CONFIG_JSON, with keys rank, store_addr,
port, host (this namespace's address: Gloo binds there), workdir, cut_at (the victim's
step, or null) and job (``ElasticJob`` fields). The victim, on reaching step cut_at,
writes ``at-cut`` and waits for the test to take its link down (``link-down``) before
it goes on: the step's collectives are then issued over a dead link. The outcome goes
to ``rank<r>.pt`` (parameters, events, when the failure was seen) or, on an error,
``rank<r>.error.json`` (type, message, time) and a non-zero exit.
"""

import faulthandler
import json
import signal
import sys
import time
from pathlib import Path

import torch

from potluck_lab.elastic_job import ElasticJob, start_worker, train, write_pid

torch.set_num_threads(1)
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks where it hangs
config = json.loads(sys.argv[1])
rank, workdir, cut_at = config["rank"], Path(config["workdir"]), config["cut_at"]
job = ElasticJob(**config["job"])
write_pid(workdir, f"rank{rank}")


def cut(steps: int) -> None:
    if steps != cut_at or (workdir / "at-cut").exists():
        return
    (workdir / "at-cut").write_text(f"{time.time():.6f}")
    deadline = time.monotonic() + 60
    while not (workdir / "link-down").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


try:
    worker = start_worker(job, f"worker-{rank}", config["store_addr"], config["port"],
                          host=config["host"])
    result = train(worker, job, workdir / f"rank{rank}.jsonl",
                   cut if cut_at is not None else None)
except Exception as exc:
    (workdir / f"rank{rank}.error.json").write_text(json.dumps(
        {"type": type(exc).__name__, "message": str(exc)[:1000], "at": time.time()}))
    raise
torch.save(result, workdir / f"rank{rank}.pt")
