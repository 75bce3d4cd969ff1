"""By hand on a GPU machine (CI has none): what the step observation costs on CUDA.

One process, the model on cuda:0, potluck.DataParallel (world size 1) with and without
the StepObserver as its clock (compute timed with CUDA events, read after each step).
Blocks of steps alternate (ABBA), each block timed between two cuda.synchronize().
Prints the median step time of each and the ratio observed / plain, per workload.

    PYTHONPATH=src python3 tools/gpu_observer_check.py
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from potluck.metrics.observer import StepFigures, StepObserver
from potluck.reducer import DataParallel
from potluck.reducer.clock import ComputeClock
from potluck.reducer.reducer import PassStats


class Recorder:
    """A sink keeping the last step's compute time."""

    last: float | None = None

    def write(self, figures: StepFigures) -> None:
        self.last = figures.compute_s

    def close(self) -> None:
        """Nothing to flush."""


def workload(width: int, depth: int, batch: int) -> tuple[nn.Module, torch.Tensor]:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers).cuda(), torch.randn(batch, width, device="cuda")


def main() -> None:
    print(torch.__version__, torch.cuda.get_device_name(0))
    for width, depth, batch in ((256, 4, 64), (2048, 8, 512), (4096, 8, 512)):
        module, x = workload(width, depth, batch)
        twin, _ = workload(width, depth, batch)
        twin.load_state_dict(module.state_dict())
        observer = StepObserver(ComputeClock("cuda"), lambda: (0, 1, 0), PassStats,
                                samples=lambda b=batch: (b, b))
        models = {"plain": DataParallel(module), "observed": DataParallel(twin, clock=observer)}
        optims = {k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in models.items()}
        times: dict[str, list[float]] = {"plain": [], "observed": []}
        steps = 50
        for block in range(21):
            for name in (("plain", "observed") if block % 2 else ("observed", "plain")):
                model, opt = models[name], optims[name]
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(steps):
                    opt.zero_grad()
                    model(x).square().mean().backward()
                    if name == "observed":
                        observer.step_started()
                    opt.step()
                    if name == "observed":
                        observer.committed()
                torch.cuda.synchronize()
                if block:  # block 0 warms up
                    times[name].append((time.perf_counter() - start) / steps)
        plain, seen = statistics.median(times["plain"]), statistics.median(times["observed"])
        journal = Recorder()
        observer.add_sink(journal)
        observer.close()  # the steps still unread are read (their events waited for)
        print(f"width {width} depth {depth} batch {batch}: plain {plain * 1e3:.3f} ms/step, "
              f"observed {seen * 1e3:.3f} ms/step, ratio observed/plain {seen / plain:.4f}; "
              f"compute of the last step {journal.last}")


if __name__ == "__main__":
    main()
