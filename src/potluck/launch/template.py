"""The spare template: one warm process per node that forks warm spares on request.

    python -m potluck.launch.template [-m] script.py [args...]
    (started by the agent, with ``POTLUCK_TEMPLATE_FD``)

A warm spare saves a restarted worker its interpreter's start-up (``import torch`` and
the first optimizer's ``torch._dynamo``: 3-4 s of CPU). On a machine whose cores the
workers keep busy that CPU has to come from somewhere: a spare at the lowest priority
could only warm up once it was taken, at the survivors' expense (measured on a 2-core
VM: the survivors' steps 15-20% slower for 4 s after each kill, 0.65 s lost per kill).
The template pays the start-up once, beside the workers' own start-up (at normal
priority: a restart that comes first waits for it), and then forks a spare per request:
a child of a warm process is warm at once, and costs the machine the pages it writes.

The protocol, on a ``SOCK_SEQPACKET`` Unix socket from the agent (``forked`` is the
agent's side): a request is ``{"id", "env"}`` with three file descriptors (the
spare's stdout and stderr, and the read end of its standby pipe); the template answers
``{"id", "pid"}`` once it forked, and ``{"exit": pid, "code": c}`` when a child ended
(``code`` as ``subprocess`` gives it: -N for a signal). The template serves no request
before it is warm. Where its imports set up CUDA (after which torch refuses CUDA to a
forked child) it says so and ends: restarts then start fresh interpreters. It ends when
the agent closes the socket, and dies with the agent (parent-death signal); its
children die with it, so no spare or worker outlives it.

Every child runs the worker bootstrap with the template's arguments (the job's script),
and shows in ``ps`` as the template does. A child starts a session of its own, takes
its descriptors as 0 (``/dev/null``), 1 and 2, and then runs the worker bootstrap
exactly as a spare started afresh would (``worker.main``): it waits, at the lowest
priority (``priority``), on its standby pipe for the environment of the worker it
becomes. It leaves the template's loop by returning from ``serve``, so that the script
ends the way any worker's does, with the interpreter's own shutdown. The template
itself ends without one (``_end``): nothing in it needs finalizing.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import selectors
import signal
import socket
import sys
import warnings
from typing import Any, NoReturn

from potluck import env
from potluck.launch import worker

_MAX_MESSAGE = 1 << 20  # bytes: a request carries a worker's environment


def serve(sock: socket.socket) -> bool:
    """Answer requests until the agent closes ``sock`` (returns False); in a forked
    child, returns True instead. The agent gone mid-answer (a broken pipe) is the same
    as closed: nobody is left to answer."""
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that it wakes us
    template = os.getpid()
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(sock, selectors.EVENT_READ, "request")
            selector.register(wakeup_read, selectors.EVENT_READ, "child")
            while True:
                for key, _ in selector.select():
                    if key.data == "child":
                        os.read(wakeup_read, 4096)
                        _report_exits(sock)
                        continue
                    message, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 3)
                    if not message:
                        return False  # the agent is done
                    request = json.loads(message)
                    _flush_c_stdio()  # nothing buffered twice
                    try:
                        if len(fds) != 3:  # out of descriptors: some did not come
                            raise OSError(f"{len(fds)} of the 3 descriptors came")
                        pid = _fork()
                    except OSError as exc:  # out of processes: the agent starts one afresh
                        _close(fds)
                        _answer(sock, {"id": request["id"], "error": str(exc)})
                        continue
                    if pid == 0:
                        signal.set_wakeup_fd(-1)
                        _close([wakeup_read, wakeup_write])
                        return _become_spare(sock, request, fds, template)
                    _close(fds)
                    _answer(sock, {"id": request["id"], "pid": pid})
    except (BrokenPipeError, ConnectionResetError):
        return False


def _fork() -> int:
    """``os.fork``. The template has one thread of its own; numpy's OpenBLAS keeps a
    pool, which handles a fork (``pthread_atfork``), as it does for every
    ``multiprocessing`` fork after ``import numpy``: Python 3.12's warning about forking
    a process with threads is about thread state that is not ours to fix here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning,
                                message=".*fork.*")
        return os.fork()


def _answer(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _flush_c_stdio() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


def _report_exits(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _answer(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _become_spare(sock: socket.socket, request: dict[str, Any], fds: list[int],
                  template: int) -> bool:
    """In the forked child: a session, descriptors and priority of its own, and numpy's
    global random state drawn afresh (Python's ``random`` does that by itself after a
    fork; torch's default seed is the same in every fresh interpreter anyway)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sock.close()
    os.setsid()
    stdout, stderr, standby = fds
    null = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null, 0), (stdout, 1), (stderr, 2)):
        os.dup2(source, target)
        os.close(source)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    environ = dict(request["env"])
    # The bootstrap checks that its parent is the process it must die with: here the
    # template (which dies with the agent), until the agent hands it its own variables.
    # (The template's pid, taken before the fork: a child whose template died already
    # has another parent, and the bootstrap then ends it.)
    environ[env.AGENT_PID] = str(template)
    environ[env.STANDBY_FD] = str(standby)
    os.environ.clear()
    os.environ.update(environ)
    return True


def fork_keeps_cuda() -> bool:
    """Whether a child of this process can still use CUDA. Once the CUDA driver is set
    up (``torch.cuda.device_count()`` is enough), torch marks every later child as a
    "bad fork" that cannot; the imports should not do that, and this says if they did
    (a throwaway child asks torch)."""
    pid = _fork()
    if pid == 0:
        import torch

        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)  # a probe: no script ran
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def main() -> None:
    fd = env.template_fd()
    if fd is None:
        sys.exit("potluck.launch.template is started by potluck run's agent")
    worker.die_with_agent()
    worker.warm_up()
    sys.stdout.flush()
    sys.stderr.flush()
    sock = socket.socket(fileno=fd)
    if not fork_keeps_cuda():
        print("potluck: the spare template cannot fork (CUDA was set up while importing); "
              "restarted workers start fresh interpreters", file=sys.stderr, flush=True)
        _end(sock)
    if not serve(sock):
        _end(sock)
    worker.main(sys.argv[1:])  # a forked child: the script, ended as any worker's is


def _end(sock: socket.socket) -> NoReturn:
    """The template's own end, once the agent is done with it: no interpreter shutdown.
    It ran no script (its children do, in processes of their own) and holds nothing
    that needs finalizing, and the shutdown of an interpreter that imported torch took
    1.5 s of CPU on a 2-core machine (clearing the modules, collecting every object
    again), which the agent waited for before it could exit."""
    sock.close()
    logging.shutdown()  # (a library's log handlers, as an interpreter's exit would)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
