"""A communication hook's RuntimeError: the backend's (a lost peer) or the hook's own."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from potluck.errors import CommHookError, PeerLostError, ReducerError
from potluck.reducer.hook_failure import hook_error, is_backend_failure

GLOO_CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
               "Connection closed by peer [127.0.0.1]:61146")
GLOO_TIMEOUT = ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                "waiting 20000ms for recv operation to complete")
SHAPES = "The size of tensor a (10) must match the size of tensor b (20) at dimension 0"


@pytest.mark.parametrize("error", [
    RuntimeError(GLOO_CLOSED),
    RuntimeError(GLOO_TIMEOUT),
    RuntimeError(f"Got the following error when running the callback: RuntimeError: "
                 f"{GLOO_CLOSED}"),
    dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"),
    PeerLostError.from_failure("bucket 0's all-reduce", "a peer abandoned the step",
                               rank=0, generation=1),
])
def test_the_backend_failures_are_lost_peers(error: BaseException) -> None:
    assert is_backend_failure(error)


@pytest.mark.parametrize("error", [
    hook_error("h", "bucket 0", RuntimeError(SHAPES), 0),  # quotes "not a lost peer"
    RuntimeError(f"Got the following error when running the callback: RuntimeError: "
                 f"{SHAPES}\n\nAt:\n  /home/me/nccl-timeout-tests/train.py(12): check\n"),
    RuntimeError(SHAPES),
    RuntimeError(f"Got the following error when running the callback: RuntimeError: {SHAPES}"),
    RuntimeError("expected scalar type Float but found Double"),
    IndexError("index 7 is out of bounds for dimension 0 with size 4"),
])
def test_a_hooks_own_errors_are_not(error: BaseException) -> None:
    assert not is_backend_failure(error)


def test_the_hooks_error_names_the_hook_the_cause_and_the_fix() -> None:
    error = hook_error("my_hook", "bucket 2", RuntimeError(SHAPES + "\nmore detail"), 3)
    assert isinstance(error, CommHookError) and isinstance(error, ReducerError)
    assert not isinstance(error, PeerLostError)
    text = str(error)
    assert "my_hook" in text and "bucket 2" in text and "rank 3" in text
    assert f"RuntimeError: {SHAPES}." in text and "more detail" not in text
    assert "not a lost peer" in text and "fix the hook" in text
