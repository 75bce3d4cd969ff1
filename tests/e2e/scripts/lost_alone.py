"""An elastic job's only worker: SIGKILLed in its first attempt once generation 0 has
formed; its restart finds no member left to admit it."""

import os
import signal

import potluck

cohort = potluck.init(timeout=20)
print(f"attempt {os.environ['TORCHELASTIC_RESTART_COUNT']} joined", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
