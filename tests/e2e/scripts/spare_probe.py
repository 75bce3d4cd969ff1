"""Crashes on its first start in local rank 1; every other start says what it found:
whether torch was imported before the script ran (a warm spare's work), its CPU
priority (its own nice value and its session's autogroup's), and the variables the
launcher gave it."""

import os
import sys

local_rank = os.environ["LOCAL_RANK"]
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
if local_rank == "1" and restart == "0":
    sys.exit("crashing on purpose")
try:
    with open("/proc/self/autogroup") as file:  # "/autogroup-N nice V", or empty
        words = file.read().split()
    autogroup = words[-1] if words else None
except OSError:
    autogroup = None
print(f"local rank {local_rank} restart {restart} argv {sys.argv[1:]} "
      f"torch preloaded {'torch' in sys.modules} "
      f"nice {os.getpriority(os.PRIO_PROCESS, 0)} autogroup {autogroup} "
      f"standby {os.environ.get('POTLUCK_STANDBY_FD')}", flush=True)
