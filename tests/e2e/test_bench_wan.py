"""``potluck bench wan`` as a user runs it: bad flags are clear errors (a run takes
minutes, so it is not run here; its figures are in docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys

import pytest

from tests.e2e.helpers import ROOT, run_to_end


def bench(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_to_end([sys.executable, "-m", "potluck", "bench", "wan", *argv],
                      timeout=50, cwd=ROOT)


@pytest.mark.timeout(60)
def test_bad_flags_are_clear_errors() -> None:
    """One run as a user sees it (exit 2, no traceback); the other refusals in-process."""
    from potluck.errors import ConfigError
    from potluck_lab.bench.wan import add_arguments, config_from_args

    result = bench("--workers", "3")
    assert result.returncode == 2, result.stderr
    assert "only --workers 2 is built" in result.stderr
    assert "Traceback" not in result.stderr
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for argv, message in ((["--batches", "70", "--inner-steps", "20"],
                           "--batches 70 is not a multiple of --inner-steps 20"),
                          (["--quota", "1.5"], "--quota 1.5: a fraction of one core"),
                          (["--bandwidth", "fast"], "a tc rate, e.g. 10mbit"),
                          (["--contenders", "ddp,dilocco"], "unknown ['dilocco']"),
                          (["--contenders", "localsgd-int4"], "name ddp (the reference")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            config_from_args(parser.parse_args(argv))
    chosen = config_from_args(parser.parse_args(["--contenders", "ddp, localsgd-int4,ddp"]))
    assert chosen.contenders == ("ddp", "localsgd-int4") and chosen.seeds == 3
    assert config_from_args(parser.parse_args(["--quota", "0.5"])).seeds == 1
    assert config_from_args(parser.parse_args(["--quick", "--seeds", "2"])).seeds == 2
    with pytest.raises(ConfigError, match="--seeds 0: at least one data order"):
        config_from_args(parser.parse_args(["--seeds", "0"]))


@pytest.mark.timeout(30)
def test_the_jobs_outer_step_flags_reach_only_the_contenders_that_use_them() -> None:
    """``wan_job``'s sweep flags: unset, DiLoCo keeps its own defaults; momentum 0 is
    plain SGD (no Nesterov, which needs momentum); a flag a contender ignores is refused
    (argparse's exit 2), not silently dropped."""
    from potluck_lab.bench.wan_job import _parse

    base = ["--batches", "10", "--out", "/tmp/unused.json", "--contender"]
    assert _parse([*base, "diloco-int8"]).outer is None
    plain = _parse([*base, "diloco", "--outer-lr", "1.0", "--outer-momentum", "0"])
    assert plain.outer == {"outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False}
    assert _parse([*base, "streaming-int8", "--mixing", "0.3"]).outer == {"mixing": 0.3}
    for argv in ([*base, "ddp", "--outer-lr", "1.0"], [*base, "localsgd-int8", "--mixing", "0.2"],
                 [*base, "diloco", "--mixing", "0.2"]):
        with pytest.raises(SystemExit) as refused:
            _parse(argv)
        assert refused.value.code == 2


@pytest.mark.timeout(30)
def test_the_jobs_rate_schedule_for_sweeps() -> None:
    """``--warmup W`` ramps the rate linearly over W steps, ``--decay`` takes it by a
    cosine to a tenth at ``--batches`` and holds it there; neither: constant."""
    from potluck_lab.bench.wan_job import _parse, lr_at

    base = ["--batches", "100", "--lr", "1e-3", "--out", "/tmp/unused.json",
            "--contender", "localsgd"]
    plain = _parse(base)
    assert [lr_at(plain, s) for s in (0, 50, 500)] == [1e-3, 1e-3, 1e-3]
    warm = _parse([*base, "--warmup", "4"])
    assert [lr_at(warm, s) for s in range(6)] == pytest.approx(
        [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    decay = _parse([*base, "--decay"])
    assert lr_at(decay, 0) == pytest.approx(1e-3)
    assert lr_at(decay, 50) == pytest.approx(0.55e-3)
    assert lr_at(decay, 100) == lr_at(decay, 300) == pytest.approx(1e-4)
    both = _parse([*base, "--warmup", "10", "--decay"])
    assert lr_at(both, 4) == pytest.approx(0.5e-3 * (0.1 + 0.45 * (1 + math.cos(0.04 * math.pi))))
    with pytest.raises(SystemExit) as refused:
        _parse([*base, "--warmup", "-1"])
    assert refused.value.code == 2


@pytest.mark.timeout(120)
def test_torch_ddp_with_its_powersgd_hook_trains_on_gloo(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The ``ddp-powersgd`` contender on two loopback ranks, past PowerSGD's first
    compressed steps (it starts at step 3). With DDP's default two buckets the ranks'
    chained all-reduces paired up wrongly there and the job failed (one rank aborted,
    the other lost its peer); in one bucket both finish with the same finite held-out
    loss."""
    import json
    import math
    import os
    import time

    from potluck.testing import free_port

    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "potluck_lab.bench.wan_job", "--contender", "ddp-powersgd",
             "--batches", "6", "--eval-every", "3", "--corpus-chars", "20000",
             "--out", str(tmp_path / "out.json")],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + 100
    try:
        outputs = [proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
                   for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    losses = [json.loads((tmp_path / f"out-rank{r}.json").read_text())["curve"][-1][2]
              for r in (0, 1)]
    assert math.isfinite(losses[0]) and losses[0] == losses[1]
