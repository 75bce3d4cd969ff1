"""The status page's HTTP server (routes, errors, port handling) and the Prometheus text."""

from __future__ import annotations

import json
import logging
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from potluck.errors import ConfigError
from potluck.status import StatusServer, render_prometheus


def rank(n: int, **over: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "rank": n, "worker": f"host:{100 + n}", "host": "host", "generation": 1, "step": 7,
        "phase": "computing", "phase_s": 0.01, "last_seen_s": 0.2, "stale": False,
        "compute_ms": 95.0, "wait_ms": 110.0, "comm_ms": 120.0, "step_ms": 210.0,
        "bytes": 1048576, "samples": 16, "share": 0.5, "samples_per_s": 168.0, "trust": None,
    }
    entry.update(over)
    return entry


def status(**over: Any) -> dict[str, Any]:
    snap: dict[str, Any] = {
        "run_id": "demo-1a2b", "time": 1764000000.0, "step": 412, "generation": 1,
        "world_size": 2, "global_batch": 32, "ranks": [rank(0), rank(1, stale=True)],
        "slowest": {"rank": 1, "reason": "rank 1: forward+backward 210 ms vs median 95 ms",
                    "since_step": 400},
        "slowest_history": [], "events": [], "efficiency": 0.93,
        "curves": {"step": [0, 1], "loss": [4.1, None], "samples_per_s": [150.0, 152.0]},
    }
    snap.update(over)
    return snap


def get(url: str) -> tuple[int, str, str, str]:
    """(status code, Content-Type, Cache-Control, body) of a GET, errors included."""
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return (answer.status, answer.headers["Content-Type"],
                    answer.headers.get("Cache-Control", ""), answer.read().decode())
    except urllib.error.HTTPError as exc:
        return (exc.code, exc.headers["Content-Type"], exc.headers.get("Cache-Control", ""),
                exc.read().decode())


@pytest.fixture
def server() -> Iterator[StatusServer]:
    calls = iter(range(10**6))

    def snapshot() -> Mapping[str, Any]:
        return status(step=next(calls))

    with StatusServer(snapshot) as srv:
        yield srv


@pytest.mark.timeout(30)
def test_url_has_the_real_port(server: StatusServer) -> None:
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}/"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", ["", "index.html"])
def test_page_is_served(server: StatusServer, path: str) -> None:
    code, ctype, _, body = get(server.url + path)
    assert code == 200
    assert ctype.startswith("text/html") and "utf-8" in ctype
    for needed in ('id="step"', 'id="banner"', 'id="ranks"', 'id="events"',
                   'id="loss-chart"', 'id="throughput-chart"', "api/status"):
        assert needed in body
    local = body.replace("http://www.w3.org/2000/svg", "")  # a namespace, not a resource
    assert "http://" not in local and "https://" not in local  # self-contained


@pytest.mark.timeout(30)
def test_api_status_is_fresh_json(server: StatusServer) -> None:
    first = get(server.url + "api/status")
    second = get(server.url + "api/status?t=1")
    assert first[:3] == (200, "application/json", "no-store")
    assert json.loads(first[3])["run_id"] == "demo-1a2b"
    assert json.loads(second[3])["step"] == json.loads(first[3])["step"] + 1


@pytest.mark.timeout(30)
def test_metrics_is_prometheus_text(server: StatusServer) -> None:
    code, ctype, _, body = get(server.url + "metrics")
    assert code == 200
    assert ctype.startswith("text/plain; version=0.0.4")
    assert "# TYPE potluck_step gauge" in body
    assert 'potluck_rank_stale{rank="1",worker="host:101"} 1' in body


@pytest.mark.timeout(30)
def test_unknown_path_is_404(server: StatusServer) -> None:
    code, ctype, _, body = get(server.url + "nope")
    assert code == 404
    assert ctype.startswith("text/plain")
    assert "/nope" in body and "/api/status" in body


@pytest.mark.timeout(30)
def test_failing_snapshot_answers_500_and_server_lives_on(
        caplog: pytest.LogCaptureFixture) -> None:
    fail = threading.Event()
    fail.set()

    def snapshot() -> Mapping[str, Any]:
        if fail.is_set():
            raise KeyError("ranks")
        return status()

    with StatusServer(snapshot) as srv, caplog.at_level(logging.ERROR, "potluck.status"):
        for path in ("api/status", "metrics"):
            code, _, _, body = get(srv.url + path)
            assert code == 500
            assert "KeyError" in body and "ranks" in body
            assert body.count("\n") == 1
        assert any("snapshot failed" in r.getMessage() and r.exc_info for r in caplog.records)
        fail.clear()
        assert get(srv.url + "api/status")[0] == 200
        assert get(srv.url)[0] == 200


@pytest.mark.timeout(30)
def test_port_in_use_is_a_config_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = StatusServer(dict, port=port)
        with pytest.raises(ConfigError, match=rf"127\.0\.0\.1:{port}.*already in use.*"
                                              r"another --status-port, or 0 for a free one"):
            server.start()
        server.close()


@pytest.mark.timeout(30)
def test_close_is_idempotent_and_frees_the_port() -> None:
    server = StatusServer(dict).start()
    port = server.port
    server.close()
    server.close()
    with StatusServer(dict, port=port) as again:  # the port is free again
        assert get(again.url + "api/status")[3] == "{}"
    StatusServer(dict).close()  # never started


@pytest.mark.timeout(30)
def test_requests_do_not_write_to_stderr(server: StatusServer,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    get(server.url + "api/status")
    assert capsys.readouterr().err == ""


# ---- Prometheus text ----------------------------------------------------------------


def labels(rank: int) -> str:
    """The labels of rank ``rank``'s samples (its worker is ``host:10<rank>`` here)."""
    return f'{{rank="{rank}",worker="host:10{rank}"}}'


def samples(text: str) -> dict[str, str]:
    """name{labels} -> value of every sample line."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return dict(line.rsplit(" ", 1) for line in lines)


@pytest.mark.timeout(10)
def test_prometheus_cohort_gauges() -> None:
    text = render_prometheus(status())
    got = samples(text)
    assert got["potluck_step"] == "412"
    assert got["potluck_world_size"] == "2"
    assert got["potluck_generation"] == "1"
    assert got["potluck_efficiency"] == "0.93"
    assert got["potluck_slowest_rank"] == "1"
    assert text.endswith("\n")
    for name in ("potluck_step", "potluck_slowest_rank", "potluck_rank_bytes"):
        assert f"# HELP {name} " in text
        assert f"# TYPE {name} gauge\n" in text


@pytest.mark.timeout(10)
def test_prometheus_per_rank_gauges_in_seconds_with_rank_and_worker_labels() -> None:
    got = samples(render_prometheus(status()))
    assert float(got[f"potluck_rank_compute_seconds{labels(0)}"]) == pytest.approx(0.095)
    assert float(got[f"potluck_rank_wait_seconds{labels(1)}"]) == pytest.approx(0.110)
    assert float(got[f"potluck_rank_comm_seconds{labels(0)}"]) == pytest.approx(0.120)
    assert float(got[f"potluck_rank_step_seconds{labels(0)}"]) == pytest.approx(0.210)
    assert got['potluck_rank_bytes{rank="1",worker="host:101"}'] == "1048576"
    assert got['potluck_rank_share{rank="0",worker="host:100"}'] == "0.5"
    assert got['potluck_rank_samples_per_second{rank="0",worker="host:100"}'] == "168.0"
    assert got['potluck_rank_stale{rank="0",worker="host:100"}'] == "0"
    assert got['potluck_rank_stale{rank="1",worker="host:101"}'] == "1"


@pytest.mark.timeout(10)
def test_prometheus_skips_missing_and_null_values() -> None:
    partial = rank(0, compute_ms=None, share=float("nan"))
    del partial["bytes"]
    text = render_prometheus(status(efficiency=None, ranks=[partial]))
    assert "nan" not in text.lower()
    assert "potluck_efficiency" not in text  # no HELP/TYPE for a family with no sample
    assert "potluck_rank_compute_seconds" not in text
    assert "potluck_rank_bytes" not in text
    assert "potluck_rank_share" not in text
    assert 'potluck_rank_wait_seconds{rank="0",worker="host:100"}' in text


@pytest.mark.timeout(10)
def test_prometheus_slowest_is_minus_one_when_none_stands_out() -> None:
    assert samples(render_prometheus(status(slowest=None)))["potluck_slowest_rank"] == "-1"
    assert samples(render_prometheus({}))["potluck_slowest_rank"] == "-1"
    assert samples(render_prometheus({})) == {"potluck_slowest_rank": "-1"}
