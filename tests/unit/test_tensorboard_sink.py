"""TensorBoard scalars from each step's figures, through a SummaryWriter-like writer."""

from __future__ import annotations

import pytest

from potluck.metrics.observer import StepFigures
from potluck.metrics.publisher import TensorBoardSink, tensorboard_sink


class FakeWriter:
    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int]] = []
        self.closed = False

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def close(self) -> None:
        self.closed = True


@pytest.mark.timeout(30)
def test_each_known_figure_becomes_a_scalar_per_rank_and_step() -> None:
    writer = FakeWriter()
    sink = TensorBoardSink(writer)
    sink.write(StepFigures(step=7, rank=2, world_size=3, generation=0, worker="h:1", host="h",
                           compute_s=0.5, wait_s=None, comm_s=0.25, step_s=1.0, bytes=10,
                           samples=4, share=0.5, loss=2.0))
    sink.close()
    assert sorted(writer.scalars) == sorted([
        ("rank2/compute_s", 0.5, 7), ("rank2/comm_s", 0.25, 7), ("rank2/step_s", 1.0, 7),
        ("rank2/samples_per_s", 8.0, 7), ("rank2/share", 0.5, 7), ("rank2/loss", 2.0, 7)])
    assert writer.closed


@pytest.mark.timeout(60)
def test_tensorboard_sink_is_none_without_tensorboard_or_writes_event_files(tmp_path) -> None:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        assert tensorboard_sink(tmp_path) is None  # optional: no TensorBoard, no sink
        return
    sink = tensorboard_sink(tmp_path)
    assert sink is not None
    sink.close()
    assert list((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
