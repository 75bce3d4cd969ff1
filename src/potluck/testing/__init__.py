"""Tools to test a training loop on potluck: real ranks, injected faults, two checks.

- ``run_ranks(fn, world_size, *args)``: ``fn(rank, world_size, *args)`` in N local
  processes on real Gloo; ``free_port()``; ``join(rank, world_size, port)``, a rank's
  fixed cohort; ``join_elastic(worker_id, port, expected=N)``, a worker's elastic one, on a store
  ``hosted_store()`` serves from the test;
  ``RankFailed`` carries a rank's traceback.
- ``Faults``: kill, freeze, a failed collective or a slow rank, at a rank and step;
  the loop calls ``faults.injector(rank, group=...)`` once a step.
- ``assert_replicas_equal``: the ranks' parameters equal bit for bit (a reference
  within a tolerance); ``assert_exactly_once``: every sample of every epoch trained
  once, from the ids each rank trained on (``SampleLedger`` writes them).

See docs/testing.md. This is for tests; a training job launches with ``potluck run``.
"""

from potluck.testing.checks import (
    SampleLedger,
    assert_exactly_once,
    assert_replicas_equal,
    exactly_once_problems,
    read_ledgers,
)
from potluck.testing.faults import Fault, Faults, Injector
from potluck.testing.ranks import (
    RankFailed,
    free_port,
    hosted_store,
    join,
    join_elastic,
    run_ranks,
)

__all__ = [
    "Fault",
    "Faults",
    "Injector",
    "RankFailed",
    "SampleLedger",
    "assert_exactly_once",
    "assert_replicas_equal",
    "exactly_once_problems",
    "free_port",
    "hosted_store",
    "join",
    "join_elastic",
    "read_ledgers",
    "run_ranks",
]
