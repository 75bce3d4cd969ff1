"""Rank 1 finishes its script, then aborts at interpreter exit (a teardown crash).

With ``--in-script`` rank 1 aborts inside the script instead: a real failure."""

import atexit
import os
import sys

rank = int(os.environ["RANK"])
print(f"rank {rank} trained", flush=True)
if rank == 1:
    if "--in-script" in sys.argv:
        os.abort()
    atexit.register(os.abort)
