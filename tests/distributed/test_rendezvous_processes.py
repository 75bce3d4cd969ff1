"""Rendezvous across real processes: one is SIGKILLed and one SIGSTOPped after generation 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import TCPStore

from potluck.testing import free_port

WORKER = Path(__file__).with_name("rendezvous_worker.py")
NAMES = ["p-0", "p-1", "p-2", "p-3"]


def _wait_keys(store: TCPStore, keys: list[str], limit: float) -> list[dict[str, Any]]:
    store.wait(keys, timedelta(seconds=limit))
    return [json.loads(store.get(k)) for k in keys]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_survivors_of_a_kill_and_a_freeze_agree_on_the_next_generation() -> None:
    port = free_port()
    store = TCPStore("127.0.0.1", port, None, True, timedelta(seconds=60),
                     wait_for_workers=False)
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(port), name, str(len(NAMES))])
             for name in NAMES]
    try:
        gen0 = _wait_keys(store, [f"test/gen0/{n}" for n in NAMES], 90)
        members = gen0[0]["members"]
        assert all(g["members"] == members for g in gen0) and len(members) == 4
        killed, frozen = procs[NAMES.index(members[0])], procs[NAMES.index(members[2])]
        killed.send_signal(signal.SIGKILL)  # the leader itself
        killed.wait(10)
        os.kill(frozen.pid, signal.SIGSTOP)
        started = time.monotonic()
        store.set("test/go", "1")
        survivors = [members[1], members[3]]
        gen1 = _wait_keys(store, [f"test/gen1/{n}" for n in survivors], 60)
        assert [g.get("members") for g in gen1] == [survivors, survivors], gen1
        assert [g["rank"] for g in gen1] == [0, 1]
        assert {g["leader"] for g in gen1} == {members[1]}
        assert time.monotonic() - started < 10  # stale beats, not the settle deadline
        for name in survivors:
            assert procs[NAMES.index(name)].wait(30) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.wait(10)
