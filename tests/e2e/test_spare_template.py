"""The spare template forks warm spares: each becomes a worker with the environment it is
handed, its exit code comes back as ``subprocess`` would give it, and none outlives the
template. Linux only (fork, a parent-death signal, SOCK_SEQPACKET)."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from potluck import env
from potluck.launch.forked import ForkedProcess, Template
from potluck.launch.spare import Spare
from tests.e2e.helpers import SCRIPTS, pid_alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the spare template is Linux-only")

PROBE = str(SCRIPTS / "template_probe.py")


def _environ(**extra: str) -> dict[str, str]:
    return {**os.environ, env.AGENT_PID: str(os.getpid()), **extra}


def _worker(template: Template, probe: str) -> ForkedProcess:
    spare = template.spare(_environ())
    assert spare is not None
    proc = spare.take(_environ(PROBE=probe))
    assert proc is not None
    return proc


def _line(proc: ForkedProcess) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().decode()


@pytest.mark.timeout(90)
def test_a_forked_worker_is_warm_and_its_exit_code_comes_back() -> None:
    template = Template([PROBE], _environ())
    try:
        proc = _worker(template, "exit 3")
        assert _line(proc) == f"parent {template.proc.pid} torch preloaded True\n"
        assert proc.wait(timeout=30) == 3
        killed = _worker(template, "sleep")
        assert _line(killed).startswith("parent ") and _line(killed) == "ready\n"
        os.killpg(killed.pid, signal.SIGKILL)  # its own session: as the agent stops one
        assert killed.wait(timeout=30) == -signal.SIGKILL
        unused = template.spare(_environ())
        assert unused is not None
        unused.discard()  # whether it was forked yet or not: nothing is left of it
        clean = _worker(template, "exit 0")
        assert clean.wait(timeout=30) == 0
    finally:
        template.close()
    assert template.proc.returncode == 0
    assert not template.alive and template.spare(_environ()) is None


@pytest.mark.timeout(90)
def test_workers_die_with_the_template() -> None:
    template = Template([PROBE], _environ())
    try:
        proc = _worker(template, "sleep")
        _line(proc)
        assert _line(proc) == "ready\n"
        os.kill(template.proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL  # with the template, at once
        deadline = time.monotonic() + 10
        while pid_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(proc.pid)
        assert template.spare(_environ()) is None  # a restart then starts afresh
    finally:
        template.close()


def test_the_template_asks_a_child_whether_torch_still_lets_it_use_cuda(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from potluck.launch.template import fork_keeps_cuda

    assert fork_keeps_cuda()  # nothing here set CUDA up
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)  # as a child sees it
    assert not fork_keeps_cuda()  # where the driver was set up before the fork


@pytest.mark.timeout(90)
def test_a_restart_before_the_template_is_warm_can_give_up_and_close_is_quiet(
        capfd: pytest.CaptureFixture[str]) -> None:
    template = Template([PROBE], _environ())
    try:
        spare = template.spare(_environ())
        assert spare is not None
        began = time.monotonic()
        assert spare.take(_environ(PROBE="exit 0"), give_up=lambda: True) is None
        assert time.monotonic() - began < 5  # a stop signal is not held up by the warm-up
        queued = template.spare(_environ())
        assert queued is not None  # still warming: the request waits in the socket
    finally:
        began = time.monotonic()
        template.close()  # (the queued request is answered to nobody, or never)
    assert time.monotonic() - began < 10
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.timeout(90)
def test_a_spare_started_afresh_is_warm_too() -> None:
    """Where there is no template (not Linux, or it cannot fork): a fresh interpreter
    started ahead, which imports torch before it is taken."""
    spare = Spare([sys.executable, "-m", "potluck.launch.worker", PROBE], _environ())
    proc = spare.take(_environ(PROBE="exit 4"))
    assert proc is not None
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    assert proc.wait(timeout=60) == 4
    assert f"parent {os.getpid()} torch preloaded True" in out
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
