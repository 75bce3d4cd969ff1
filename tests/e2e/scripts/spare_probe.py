"""Crashes on its first start in local rank 1; every other start says what it found:
whether torch was imported before the script ran (a warm spare's work), its CPU
priority, and the variables the launcher gave it."""

import os
import sys

local_rank = os.environ["LOCAL_RANK"]
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
if local_rank == "1" and restart == "0":
    sys.exit("crashing on purpose")
print(f"local rank {local_rank} restart {restart} argv {sys.argv[1:]} "
      f"torch preloaded {'torch' in sys.modules} "
      f"nice {os.getpriority(os.PRIO_PROCESS, 0)} "
      f"standby {os.environ.get('POTLUCK_STANDBY_FD')}", flush=True)
