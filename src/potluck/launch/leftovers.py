"""An etcd job's keys that another job left under the same ``--run-id``.

A hosted store dies with its job; etcd keeps keys until someone deletes them. Node 0
deletes its job's keys at the end, but a job whose node 0 was lost, or that crashed
whole, leaves them. A new job on them would read the old cohort's records. So each
agent looks before it starts any worker, and refuses in one line:

- node 0 finds node 0's worker count already published: a fresh job's node 0 is the
  first to write it, so another job holds the run id (running or ended);
- another node finds agents on the roll and none of them beating: an ended job's.

``judge`` decides from what was read; ``refuse_leftovers`` reads etcd and raises.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from potluck import keys
from potluck.errors import ConfigError
from potluck.launch.config import LaunchConfig
from potluck.launch.roll import agent_beats

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store


def judge(node_rank: int, published: bool, started: int, beating: bool) -> str | None:
    """Why the run id's keys belong to another job (None: they do not). ``published``:
    node 0's worker count is on the store; ``started``: agents that checked in;
    ``beating``: one of them beat while this agent watched."""
    if node_rank == 0 and published:
        return "its agents still beat: it is running" if beating else "it ended"
    if started > 0 and not beating:
        return "its agents no longer beat: it ended"
    return None


def refuse_leftovers(store: Store, config: LaunchConfig, watch_s: float) -> None:
    """Raise ``ConfigError`` when ``store`` (the run id's keys in etcd) holds another
    job's keys; say how to start clean. Beats are other hosts' clocks, so only a change
    within ``watch_s`` counts as a beat (it is watched only where keys were found)."""
    from potluck.rendezvous.heartbeat import read_beats

    run_id = config.run_id
    published = store.check([keys.agents(run_id, "nproc0")])
    started_key = keys.agents(run_id, "started")
    started = int(store.get(started_key).decode()) if store.check([started_key]) else 0
    beating = False
    if published or started:
        agents = [f"agent{i}" for i in range(started)]
        before = read_beats(agent_beats(store, run_id), agents)
        time.sleep(watch_s)
        beating = read_beats(agent_beats(store, run_id), agents) != before
    why = judge(config.node_rank, published, started, beating)
    if why is not None:
        raise ConfigError(
            f"etcd at {config.etcd} already holds the keys of a job with --run-id {run_id} "
            f"({why}): give this job a --run-id of its own, or delete that job's keys "
            f"(etcdctl --endpoints {config.etcd} del --prefix /potluck/{run_id}/)")
