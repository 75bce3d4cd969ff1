"""Every rank finishes its work; then rank 1's process dies of SIGABRT, as a C++ teardown
abort at exit would ("terminate called without an active exception")."""

import os

import potluck

cohort = potluck.init(timeout=30)
cohort.barrier()
rank = cohort.rank
cohort.close()
print(f"rank {rank} done", flush=True)
if rank == 1:
    os.abort()
