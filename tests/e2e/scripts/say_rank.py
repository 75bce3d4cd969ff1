"""Prints its local rank on stdout and on stderr; imports nothing heavy."""

import os
import sys

rank = os.environ["LOCAL_RANK"]
print(f"out from local rank {rank}", flush=True)
print(f"err from local rank {rank}", file=sys.stderr, flush=True)
