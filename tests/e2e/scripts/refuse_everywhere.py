"""``refuse_everywhere.py DIR N``: every worker raises the same ``ConfigError``, as a
bad argument to ``potluck.prepare`` would, once N workers have met in DIR (so each
raises it, none is stopped first). Imports no torch."""

import os
import sys
import time
from pathlib import Path

from potluck.errors import ConfigError


def deeper(depth: int) -> None:  # frames a traceback would show
    if depth:
        deeper(depth - 1)
    raise ConfigError("global_batch=0 must be a positive int (samples per step, all "
                      "workers together), e.g. global_batch=64")


folder, expected = Path(sys.argv[1]), int(sys.argv[2])
(folder / str(os.getpid())).touch()
deadline = time.monotonic() + 30
while len(list(folder.iterdir())) < expected and time.monotonic() < deadline:
    time.sleep(0.01)
deeper(20)
