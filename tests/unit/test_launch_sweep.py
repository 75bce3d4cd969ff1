"""``policy.why_end``: when an elastic agent ends a worker that is still running."""

from __future__ import annotations

from potluck.launch.policy import CohortView, why_end


def test_a_member_left_out_without_leaving_is_ended() -> None:
    why = why_end(CohortView("w1", left_out=True, admitted=True), finished_for=None, grace=5)
    assert why is not None and "went on without it" in why


def test_a_member_that_left_or_is_still_in_is_not() -> None:
    assert why_end(CohortView("w1", left_out=True, left=True, admitted=True),
                   finished_for=None, grace=5) is None  # its own way out
    assert why_end(CohortView("w1", admitted=True), finished_for=None, grace=5) is None
    assert why_end(CohortView(None), finished_for=None, grace=5) is None  # not joined yet


def test_a_joiner_still_waiting_after_the_run_finished_is_ended_after_grace() -> None:
    waiting = CohortView("w2")
    assert why_end(waiting, finished_for=2.0, grace=5) is None
    why = why_end(waiting, finished_for=6.0, grace=5)
    assert why is not None and "still waiting to be admitted" in why
    # members of the last generation finish (save, write results) in their own time
    assert why_end(CohortView("w1", admitted=True), finished_for=60.0, grace=5) is None
