"""``wait_for_file.py PATH``: waits (at most 60 s) until PATH exists, then exits 0, so
that its node's job stays up while the test needs it."""

import sys
import time
from pathlib import Path

path, deadline = Path(sys.argv[1]), time.monotonic() + 60
while not path.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
