"""The cohort bench finds the status page where the agents' logs say it is served."""

from __future__ import annotations

from potluck_lab.bench.cohort_story import served_port


def test_the_last_page_an_agent_serves_is_the_one_it_moved_to() -> None:
    log = ("potluck run: status page at http://0.0.0.0:8080/ (JSON http://0.0.0.0:8080/api/"
           "status, Prometheus http://0.0.0.0:8080/metrics)\n"
           "potluck run: the job's store moved to this node (node 1): the status page is "
           "now at http://0.0.0.0:9090/ (JSON http://0.0.0.0:9090/api/status)\n")
    assert served_port(log) == 9090
    assert served_port(log.splitlines()[0]) == 8080
    assert served_port("[worker0]: step 3\n") is None
    assert served_port("status page at http://[::1]:7070/ (JSON") == 7070
