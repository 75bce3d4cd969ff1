"""Rank 1 raises after the first barrier; rank 0 would otherwise wait for a long time."""

import os
import time

import potluck

cohort = potluck.init(timeout=60)
print(f"pid {os.getpid()}", flush=True)
cohort.barrier()
if cohort.rank == 1:
    raise ValueError("rank one exploded on purpose")
time.sleep(120)
