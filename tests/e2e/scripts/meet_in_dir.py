"""``meet_in_dir.py DIR N``: says its local rank, then waits until N workers (of any
node) have said theirs in DIR, so no node's job ends before every node's began."""

import os
import sys
import time
from pathlib import Path

folder, expected = Path(sys.argv[1]), int(sys.argv[2])
rank = os.environ["LOCAL_RANK"]
(folder / str(os.getpid())).touch()
deadline = time.monotonic() + 60
while len(list(folder.iterdir())) < expected:
    if time.monotonic() > deadline:
        sys.exit(f"only {len(list(folder.iterdir()))} of {expected} workers started")
    time.sleep(0.05)
print(f"out from local rank {rank} (RANK {os.environ['RANK']} of WORLD_SIZE "
      f"{os.environ['WORLD_SIZE']})", flush=True)
