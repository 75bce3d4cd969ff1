"""One rank of ``potluck bench plan``'s all-reduce calibration: plain Gloo all-reduces
of a few sizes, each timed by the wall clock and by the process's CPU time.

Started like ``plan_job`` (``--ready``, then ``--go`` once under its quota). Rank 0
writes, per size in bytes, the median wall seconds and CPU seconds of an all-reduce
to ``--out``. The CPU time counts every thread of the process, Gloo's and the
kernel's work on its behalf.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPEATS = 8
WARMUP = 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m potluck_lab.bench.plan_ring_job")
    p.add_argument("--sizes", required=True, help="bytes, comma-separated")
    p.add_argument("--ready", type=Path, required=True)
    p.add_argument("--go", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    a.ready.write_text(str(os.getpid()))
    while not a.go.exists():
        time.sleep(0.005)
    dist.init_process_group("gloo")
    timings = {}
    for size in (int(s) for s in a.sizes.split(",")):
        buffer = torch.ones(size // 4)
        wall, cpu = [], []
        for _ in range(WARMUP + REPEATS):
            dist.barrier()
            cpu_began, began = time.process_time(), time.perf_counter()
            dist.all_reduce(buffer)
            wall.append(time.perf_counter() - began)
            cpu.append(time.process_time() - cpu_began)
        timings[size] = [statistics.median(wall[WARMUP:]), statistics.median(cpu[WARMUP:])]
    if dist.get_rank() == 0:
        a.out.write_text(json.dumps(timings))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
