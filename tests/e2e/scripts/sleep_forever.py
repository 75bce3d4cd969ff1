"""Every rank reports its pid and sleeps: for the Ctrl-C test."""

import os
import time

print(f"pid {os.getpid()}", flush=True)
time.sleep(300)
