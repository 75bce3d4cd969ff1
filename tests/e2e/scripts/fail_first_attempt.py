"""Rank 1 fails in the first attempt only; with --max-restarts 1 the job succeeds."""

import os

import potluck

cohort = potluck.init(timeout=30)
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
cohort.barrier()
if attempt == 0 and cohort.rank == 1:
    raise RuntimeError("first attempt fails on purpose")
cohort.barrier()
print(f"attempt {attempt} done", flush=True)
cohort.close()
