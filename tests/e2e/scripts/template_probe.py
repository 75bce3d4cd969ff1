"""Run by a spare the template forked: says who its parent is and whether torch was
there before the script, then does what ``PROBE`` says (``exit N``, or ``sleep``)."""

import os
import sys
import time

print(f"parent {os.getppid()} torch preloaded {'torch' in sys.modules}", flush=True)
what = os.environ["PROBE"]
if what == "sleep":
    print("ready", flush=True)
    time.sleep(600)
sys.exit(int(what.split()[1]))
