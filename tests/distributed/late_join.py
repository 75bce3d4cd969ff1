"""A worker that joins an elastic cohort once its founders train (for the joiner tests)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from potluck.cohort import Cohort
    from potluck_lab.elastic_job import ElasticJob

TRAINING_KEY = "test/founders-train"  # rank 0 committed a step: the cohort is founded


def join_after_founders(rank: int, port: int, job: ElasticJob,
                        joiner: int = 2) -> tuple[torch.distributed.TCPStore, Cohort]:
    """(store, cohort) of a worker of ``job`` on loopback: rank ``joiner`` joins once the
    founders train (``TRAINING_KEY``); heartbeats fast enough for ``job``'s short
    collective timeout."""
    from potluck.cohort import GroupSpec, join_elastic
    from potluck.rendezvous import RendezvousConfig

    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=False,
                                       timeout=timedelta(seconds=30))
    if rank == joiner:
        store.wait([TRAINING_KEY], timedelta(seconds=90))  # the founders train: it joins late
    config = RendezvousConfig(token=job.token, expected=job.expected, heartbeat_interval=0.2,
                              heartbeat_timeout=1.5, settle_timeout=10.0, join_timeout=60.0)
    cohort = join_elastic(store, f"worker-{rank}", config,
                          GroupSpec("gloo", job.collective_timeout, "127.0.0.1"))
    return store, cohort
