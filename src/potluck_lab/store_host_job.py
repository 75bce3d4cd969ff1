"""A multi-node elastic job that leaves a trace, for the store-host tests and bench.

Run by ``potluck run --elastic --nnodes N ... -m potluck_lab.store_host_job --trace DIR``
on every node. It is ``examples/elastic.py``'s job (the same data, model, optimizer and
global batches, so one process gives the same parameters: ``tests/e2e/helpers.py``), and
each worker writes into ``DIR``, under ``node<N>-<pid>``:

- ``.jsonl``: the samples of each committed step (``potluck.testing.SampleLedger``);
- ``.times``: a JSON line per committed step (``{"step": n, "at": t}``) and per failed
  step (``{"failed": n, "at": t}``; ``t`` is the wall clock when the worker saw it),
  and before each step its part (``{"pending": n, "epoch": e, "ids": [...]}``): a worker
  killed between a step's commit and its ledger line trained that part all the same
  (``trained``);
- ``.pt``: the final parameters, if the worker finished.

``--samples`` and ``--global-batch`` size the job (96 and 12, as the example's).
``--stop-file PATH``: the job ends after as many epochs as the file says, once it
holds a number; the caller writes it (atomically) well before that epoch's end, since
every worker reads it before each step and all must stop at the same boundary.

``read_traces`` and ``recovery_s`` read them back: which node committed which steps and
when, and how long the first failure took to the next committed step; ``trained`` the
samples every committed step trained.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

SAMPLES = 96
GLOBAL_BATCH = 12


@dataclass
class Trace:
    """One worker's trace: its node, its committed steps and failures, (step, time)."""

    node: int
    name: str
    commits: list[tuple[int, float]] = field(default_factory=list)
    pending: tuple[int, int, list[int]] | None = None  # its last step's (n, epoch, ids)
    parts: dict[int, set[int]] = field(default_factory=dict)  # step -> the ids it prepared
    failures: list[tuple[int, float]] = field(default_factory=list)
    params: Path | None = None  # the final parameters, if it finished

    @property
    def last_step(self) -> int:
        return max((s for s, _ in self.commits), default=0)


def read_traces(directory: Path) -> list[Trace]:
    """Every worker's trace in ``directory``, in node order."""
    traces = []
    for path in sorted(directory.glob("node*.times")):
        trace = Trace(int(path.stem.split("-")[0][4:]), path.stem)
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "failed" in record:
                trace.failures.append((record["failed"], record["at"]))
            elif "pending" in record:
                trace.pending = (record["pending"], record["epoch"], record["ids"])
                trace.parts[record["pending"]] = set(record["ids"])
            else:
                trace.commits.append((record["step"], record["at"]))
        params = path.with_suffix(".pt")
        trace.params = params if params.exists() else None
        traces.append(trace)
    return sorted(traces, key=lambda t: (t.node, t.name))


def trained(directory: Path) -> list[tuple[int, list[int]]]:
    """Every worker's committed parts (its ledger), and the part a worker was killed
    with where the others committed that step without failing it first (so its part,
    sent before it died, is in the step: it died between the commit and its ledger
    line), unless a worker that committed that step trained that part itself (the
    killed one was not in the generation that committed it: it formed without a failed
    step, after a group that was not built). Feed it to
    ``potluck.testing.exactly_once_problems``."""
    from potluck.testing import read_ledgers

    records = list(read_ledgers(directory))
    traces = read_traces(directory)
    for trace in traces:
        if trace.pending is None or trace.pending[0] <= trace.last_step:
            continue
        step, epoch, ids = trace.pending
        others = [t for t in traces if t is not trace]
        committers = [t for t in others if step in {s for s, _ in t.commits}]
        if any(step not in {f for f, _ in t.failures} for t in committers) and \
                not any(t.parts.get(step, set()) & set(ids) for t in committers):
            records.append((epoch, ids))
    return records


def recovery_s(trace: Trace) -> float | None:
    """From the worker's first failed step to its next committed step (None: never)."""
    if not trace.failures:
        return None
    failed_at = trace.failures[0][1]
    after = [at for _, at in trace.commits if at > failed_at]
    return min(after) - failed_at if after else None


def steps_before_failure(trace: Trace) -> int:
    """The committed steps before the worker's first failure (all, if none)."""
    if not trace.failures:
        return trace.last_step
    first = trace.failures[0][1]
    return max((s for s, at in trace.commits if at < first), default=0)


def single_process(epochs: int, samples: int = SAMPLES,
                   global_batch: int = GLOBAL_BATCH) -> dict[str, torch.Tensor]:
    """The parameters one process gets training on the job's global batches."""
    from potluck import DataCursor

    x_all, y_all, net, sgd = _setup(samples)
    cursor = DataCursor(samples, global_batch, seed=3)
    while cursor.epoch < epochs:
        index = cursor.global_indices()
        sgd.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x_all[index]), y_all[index])
        loss.backward()  # type: ignore[no-untyped-call]
        sgd.step()
        cursor.commit()
    return net.state_dict()


def _setup(samples: int = SAMPLES) -> tuple[torch.Tensor, torch.Tensor, torch.nn.Module,
                                           torch.optim.SGD]:
    """The data, the model and the optimizer, as ``examples/elastic.py`` makes them."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x_all, y_all = torch.randn(2, samples, 8, dtype=torch.float64,
                               generator=torch.Generator().manual_seed(0))
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    sgd = torch.optim.SGD(net.double().parameters(), lr=0.05, momentum=0.9)
    return x_all, y_all, net, sgd


def main(argv: list[str] | None = None) -> None:
    import potluck
    from potluck.testing import SampleLedger

    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", required=True, help="a directory every worker writes to")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=20.0, help="collective timeout")
    parser.add_argument("--settle-timeout", type=float, default=30.0,
                        help="how long a next generation waits for its members to register")
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument("--global-batch", type=int, default=GLOBAL_BATCH)
    parser.add_argument("--stop-file", type=Path, help="holds the epochs to train, once "
                                                      "the caller knows")
    args = parser.parse_args(argv)

    x_all, y_all, net, sgd = _setup(args.samples)
    data = torch.utils.data.TensorDataset(x_all, y_all, torch.arange(args.samples))
    cohort = potluck.init(timeout=args.timeout, settle_timeout=args.settle_timeout)
    model, opt, loader = potluck.prepare(net, sgd, data, global_batch=args.global_batch,
                                         seed=3, cohort=cohort, timeout=args.timeout,
                                         checkpoint_dir=args.checkpoint_dir)
    stem = Path(args.trace) / f"node{os.environ.get('GROUP_RANK', '0')}-{os.getpid()}"
    with SampleLedger(stem.with_suffix(".jsonl")) as ledger, \
            stem.with_suffix(".times").open("a") as times:
        while loader.epoch < epochs_to_train(args.epochs, args.stop_file):
            started = loader.epoch  # (a failed step ends the loop mid-epoch)
            for x, y, ids in loader:
                if loader.epoch >= epochs_to_train(args.epochs, args.stop_file):
                    break  # (admitted at the last boundary: nothing left to train)
                time.sleep(args.step_time)
                epoch, before = loader.epoch, opt.steps
                times.write(json.dumps({"pending": before + 1, "epoch": epoch,
                                        "ids": ids.tolist()}) + "\n")
                times.flush()
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()  # type: ignore[no-untyped-call]
                failed_at = time.time() if model.step_failed else None
                result = opt.step()
                if opt.steps > before:
                    ledger.record(epoch, ids.tolist())
                    times.write(json.dumps({"step": opt.steps, "at": time.time()}) + "\n")
                elif result.failed:
                    times.write(json.dumps({"failed": before + 1,
                                            "at": failed_at or time.time()}) + "\n")
                times.flush()
            if opt.cohort.rank == 0 and loader.epoch > started:
                print(f"epoch {loader.epoch - 1} done at step {opt.steps} with "
                      f"{opt.cohort.world_size} workers", flush=True)
    if opt.finish():
        torch.save(net.state_dict(), stem.with_suffix(".pt"))


def epochs_to_train(planned: int, stop_file: Path | None) -> int:
    """``planned``, or fewer once the stop file says so."""
    if stop_file is None:
        return planned
    try:
        return min(planned, int(stop_file.read_text()))
    except (OSError, ValueError):  # not written yet
        return planned


if __name__ == "__main__":
    main()
