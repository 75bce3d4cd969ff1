"""A worker that leaves an elastic cohort: the loader ends, and ``opt.finish()`` says so
(one in-process worker on a store of the test's own), so the code after the loop can
keep the run's result to the workers that trained to the end."""

from __future__ import annotations

from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from potluck.testing import free_port
from potluck_lab.elastic_job import ElasticJob, start_worker

JOB = ElasticJob(expected=1, epochs=1)  # 48 samples, 4 steps of 12


def _train(leave_at: int | None) -> tuple[int, bool, bool]:
    """Batches trained, ``opt.left``, ``opt.finish()``."""
    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=30))
    worker = start_worker(JOB, "worker-0", "127.0.0.1", port)
    model, opt, loader = worker.model, worker.optimizer, worker.loader
    batches = 0
    try:
        while loader.epoch < JOB.epochs and not opt.left:
            for _, x, y in loader:
                if opt.steps == leave_at:
                    opt.request_leave()  # as SIGTERM under opt.leave_on_sigterm()
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                opt.step()
                batches += 1
        return batches, opt.left, opt.finish()
    finally:
        worker.cohort.close()  # (safe twice)
        del store


@pytest.mark.timeout(60)
def test_finish_is_false_on_a_worker_that_left_and_true_on_one_that_stayed() -> None:
    assert _train(leave_at=1) == (2, True, False)  # left at the boundary after step 2
    assert _train(leave_at=None) == (4, False, True)
