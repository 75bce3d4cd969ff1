"""Run a function as N ranks in local processes on one group (tests and benches).

Each rank is a child of a fork server that preloaded torch, so starting a rank costs
milliseconds, not a torch import. The parent picks a free port, waits with a deadline,
reaps every child on success, failure or timeout, and re-raises a rank's failure with
that rank's traceback. This is not the user-facing launcher (``potluck run``).
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Collection, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from potluck.errors import PotluckError

if TYPE_CHECKING:
    from potluck.cohort import Cohort


class RankFailed(PotluckError):
    """A rank raised, died, or missed the deadline; the message carries its traceback."""


_GIVEN: set[int] = set()  # the ports free_port handed out in this process


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago, and not handed out before in
    this process: once the probe's socket closes, the kernel may give the same port to
    the next probe, and two ports picked in a row would then be one (a test's second
    store failed with EADDRINUSE so)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def join(rank: int, world_size: int, port: int, *, timeout: float = 30.0) -> Cohort:
    """This rank's fixed cohort on loopback, rank 0 hosting the store on ``port``: what
    ``potluck.init()`` gives a worker of ``potluck run --nproc-per-node N``.

    Call it in a function that ``run_ranks(..., init_group=False)`` runs, with one
    ``free_port()`` for every rank, and pass the cohort on (``prepare(cohort=...)``).
    ``timeout`` bounds joining and every collective.
    """
    from potluck.cohort import init
    from potluck.env import WorkerEnv

    env = WorkerEnv(rank=rank, world_size=world_size, local_rank=rank,
                    local_world_size=world_size, master_addr="127.0.0.1", master_port=port,
                    source="torchrun")
    return init(env=env, timeout=timeout)


@contextlib.contextmanager
def hosted_store(timeout: float = 60.0) -> Iterator[tuple[int, Any]]:
    """A store on a free loopback port, hosted by this process while the block runs, as
    ``potluck run --elastic``'s agent hosts one: it outlives every worker, so ranks that
    ``join_elastic`` on it may die. Yields ``(port, store)``; the store serves until
    its last reference goes."""
    from torch._C._distributed_c10d import TCPStore

    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=timeout))
    yield port, store


def join_elastic(worker_id: str, port: int, *, expected: int, timeout: float = 30.0,
                 heartbeat_timeout: float = 1.5, token: str = "potluck-test") -> Cohort:
    """Join (or found) the elastic cohort of ``expected`` founders that meets on the
    store a test hosts on loopback ``port`` (``torch.distributed.TCPStore(...,
    is_master=True)`` in the test process, as ``potluck run --elastic``'s agent hosts
    it: it outlives every worker). A worker that joins after the founders started is
    admitted at the cohort's next step boundary. ``timeout`` bounds every collective:
    a peer silent that long is given up on; one whose heartbeats stop for
    ``heartbeat_timeout`` seconds is lost at once."""
    from datetime import timedelta

    from torch._C._distributed_c10d import TCPStore

    from potluck.cohort import GroupSpec
    from potluck.cohort import join_elastic as join_store
    from potluck.rendezvous import RendezvousConfig

    store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout))
    config = RendezvousConfig(token=token, expected=expected, heartbeat_interval=0.2,
                              heartbeat_timeout=heartbeat_timeout, settle_timeout=10.0,
                              join_timeout=60.0)
    return join_store(store, worker_id, config, GroupSpec("gloo", timeout, "127.0.0.1"))


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 90.0,
    threads: int = 1,
    collective_timeout: float = 60.0,
    init_group: bool = True,
    may_die: Collection[int] = (),
    backend: str = "gloo",
) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` processes; return results.

    With ``init_group`` the default process group is initialized (``backend``, loopback)
    before ``fn`` runs and destroyed after; under ``"nccl"`` rank r uses CUDA device r.
    ``fn`` and its results must be picklable; tensors in results travel through
    ``torch.save``. Tensors in ``args`` travel by torch.multiprocessing, in memory the
    ranks share: pass a state as ``torch.save`` bytes, or ranks that load it in place
    would write to one another's. Ranks in
    ``may_die`` (fault-injection tests) may die without reporting, or hang: their result
    is None, and once every other rank has reported they are killed.
    """
    ctx = mp.get_context("forkserver")
    # torch._dynamo too: a rank's first optimizer imports it (seconds, on every rank
    # at once); imported once here it starts no thread, so forking after it is safe.
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo"])
    port = free_port()
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]  # no semaphores to leak
    procs = [
        ctx.Process(
            target=_child,
            args=(fn, rank, world_size, port, args, pipes[rank][1], threads,
                  collective_timeout, init_group, os.getpid(), backend),
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    for _, writer in pipes:
        writer.close()  # the children hold the write ends now
    try:
        return _collect(procs, [reader for reader, _ in pipes], timeout, set(may_die))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        for proc in procs:
            proc.join(timeout=10)
        for reader, _ in pipes:
            reader.close()


def _collect(procs: list[Any], readers: list[Any], timeout: float,
             may_die: set[int]) -> list[Any]:
    results: dict[int, Any] = {}
    waiting = dict(enumerate(readers))
    deadline = time.monotonic() + timeout
    while waiting:
        if set(waiting) <= may_die:  # only expendable ranks left (e.g. a frozen one)
            for rank in waiting:
                procs[rank].kill()
                results[rank] = None
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RankFailed(f"ranks {sorted(waiting)} did not finish within {timeout:.0f} s")
        ready = mp_connection.wait(list(waiting.values()), timeout=min(remaining, 0.5))
        for rank, reader in list(waiting.items()):
            if reader not in ready:
                continue
            try:
                ok, payload = reader.recv()
            except EOFError:  # the rank closed its pipe without a word: it died
                if rank in may_die:
                    results[rank] = None
                    del waiting[rank]
                    continue
                procs[rank].join(timeout=5)
                raise RankFailed(f"rank {rank} died with exit code {procs[rank].exitcode} "
                                 "before reporting") from None
            if not ok:
                raise RankFailed(f"rank {rank} failed:\n{payload}")
            results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            del waiting[rank]
    return [results[r] for r in range(len(readers))]


def _exit_with_caller(caller_pid: int) -> None:
    """Exit this rank as soon as the process that called run_ranks is gone.

    Ranks are children of the fork server, which does not always follow its caller
    out; a SIGTERMed or SIGKILLed caller must not leave ranks behind.
    """

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(caller_pid, 0)
            except ProcessLookupError:
                os._exit(1)

    threading.Thread(target=watch, name="potluck-orphan-watch", daemon=True).start()


def _child(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    args: tuple[Any, ...],
    conn: Any,
    threads: int,
    collective_timeout: float,
    init_group: bool,
    caller_pid: int,
    backend: str,
) -> None:
    import torch.distributed as dist

    _exit_with_caller(caller_pid)
    torch.set_num_threads(threads)
    try:
        if init_group:
            if backend == "nccl":
                torch.cuda.set_device(rank)
            dist.init_process_group(
                backend,
                init_method=f"tcp://127.0.0.1:{port}",
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=collective_timeout),
            )
        result = fn(rank, world_size, *args)
        buffer = io.BytesIO()
        torch.save(result, buffer)
        conn.send((True, buffer.getvalue()))
    except BaseException:
        conn.send((False, f"[pid {os.getpid()}] {traceback.format_exc()}"))
    finally:
        conn.close()
        if init_group and dist.is_initialized():
            dist.destroy_process_group()
