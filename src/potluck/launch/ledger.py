"""``potluck run --reputation PATH``: at the end of a run, append this machine's
record to the reputation file (``potluck.reputation``).

The workers' ``rank_step`` journals carry what the record needs (their speed, their
steps' times, trust's notes). ``with_journals`` has them written: to ``--metrics-dir``
when given, else to a folder of the ledger's own, removed at the end. ``write`` sums
them up for this host (``reputation.summary``) under the machine's identity
(``reputation.identity``) and appends one line.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from potluck.launch.config import LaunchConfig
from potluck.reputation import append
from potluck.reputation.identity import worker_identity
from potluck.reputation.record import RunRecord
from potluck.reputation.summary import summarize

log = logging.getLogger(__name__)


class Ledger:
    """One run's record of this machine: made before the agent starts, written after."""

    def __init__(self, path: str, identity_folder: str | None = None) -> None:
        self.path = path
        self.worker = worker_identity(identity_folder)
        self.began = time.time()
        self._own: str | None = None

    def with_journals(self, config: LaunchConfig) -> LaunchConfig:
        """``config`` with a metrics folder, the ledger's own if it had none."""
        if config.metrics_dir is not None:
            return config
        self._own = tempfile.mkdtemp(prefix="potluck-ledger-")
        return replace(config, metrics_dir=self._own)

    def write(self, config: LaunchConfig, code: int) -> RunRecord | None:
        """Append the run's record (``code``: the launcher's exit code); None if the
        workers left no journal (a script without potluck's loop)."""
        try:
            records = list(_journals(Path(config.metrics_dir or "") / "ranks"))
            record = summarize(records, host=socket.gethostname(),
                               nproc=config.nproc_per_node, run=config.run_id,
                               worker=self.worker, began=self.began, ended=time.time(),
                               failed=code == 1)
            if record.in_cohort_s == 0 and record.samples_per_s is None:
                return None
            append(self.path, [record])
            return record
        finally:
            if self._own is not None:
                shutil.rmtree(self._own, ignore_errors=True)


def _journals(folder: Path) -> list[dict[str, Any]]:
    out = []
    for file in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        for line in file.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line torn by a killed worker
            if isinstance(record, dict) and "time" in record:
                out.append(record)
    return out
