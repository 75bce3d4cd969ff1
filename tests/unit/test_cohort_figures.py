"""The cohort bench's figures from its workers' records (pure)."""

from __future__ import annotations

from pathlib import Path

import torch

from potluck_lab.bench import cohort_figures as fig


def _worker(node: int, records: list[dict], ledger: list[tuple[int, list[int]]]) -> fig.Worker:
    return fig.Worker(node, records=records, ledger=ledger)


def _commit(steps: int, lost: list[list[int]] | None = None) -> dict:
    return {"kind": "commit", "steps": steps, "at": float(steps), "lost": lost or []}


def test_a_part_sent_before_a_kill_counts_once_where_the_round_lost_nothing() -> None:
    survivor = _worker(0, [_commit(1), _commit(2), {"kind": "done", "finished": True}],
                       [(0, [0, 1]), (0, [4, 5])])
    killed = _worker(1, [_commit(1), {"kind": "pending", "round": 2, "epoch": 0, "ids": [6]},
                         {"kind": "pending", "round": 2, "epoch": 0, "ids": [7]}],
                     [(0, [2, 3])])
    assert fig.exactly_once([survivor, killed], 8, 1) == {"twice": 0, "missing": 0}
    # the round named positions lost with it: they were handed out again, not trained here
    survivor.records[1] = _commit(2, [[6, 8]])
    assert fig.exactly_once([survivor, killed], 8, 1) == {"twice": 0, "missing": 2}
    # every-step sync: the others failed the step and redid it (with the samples)
    survivor.records[1:2] = [{"kind": "failed", "round": 2}, _commit(2)]
    survivor.ledger[1] = (0, [4, 5, 6, 7])
    assert fig.exactly_once([survivor, killed], 8, 1) == {"twice": 0, "missing": 0}


def test_twice_and_missing_are_counted() -> None:
    a = _worker(0, [], [(0, [0, 1, 2])])
    b = _worker(1, [], [(0, [2])])
    assert fig.exactly_once([a, b], 4, 1) == {"twice": 1, "missing": 1}


def test_the_attackers_quarantine_counts_rounds_from_its_first_corrupted_one() -> None:
    member = {"kind": "member", "worker": "w2"}
    attacker = _worker(2, [member, {"kind": "attack", "round": 7},
                           {"kind": "attack", "round": 8}], [])
    honest = _worker(0, [{"kind": "member", "worker": "w0"},
                         {"kind": "trust", "event": "quarantine", "member": "w2", "step": 9,
                          "evidence": [{"kind": "far from the center"}]}], [])
    caught = fig.quarantine([honest, attacker], 2)
    assert caught == {"first_attack": 7, "round": 9, "rounds": 3,
                      "evidence": ["far from the center"]}
    assert fig.honest_quarantines([honest, attacker], 2) == []
    assert fig.quarantine([honest, _worker(3, [], [])], 3) is None  # it never attacked


def test_an_attacker_never_quarantined_comes_with_its_strikes(tmp_path: Path) -> None:
    import json

    attacker = _worker(2, [{"kind": "member", "worker": "w2"},
                           {"kind": "attack", "round": 1}], [])
    (tmp_path / "ranks").mkdir()
    strike = {"kind": "event", "what": "strike", "member": "w2", "step": 1,
              "text": "rank 2 (w2): far from the center"}
    lines = [strike, strike, {**strike, "step": 2},  # (each rank notes the same strike)
             {**strike, "member": "w0", "step": 3}, {"kind": "rank_step", "step": 1}]
    for rank in ("a", "b"):
        (tmp_path / "ranks" / f"rank-{rank}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in lines))
    caught = fig.quarantine([attacker], 2, tmp_path)
    assert caught is not None and caught["round"] is None
    assert caught["strikes"] == ["round 1: rank 2 (w2): far from the center",
                                 "round 2: rank 2 (w2): far from the center"]
    from potluck_lab.bench.cohort_report import _potluck_line

    run = {"contender": "potluck", "time_to_target_s": 10.0, "wall_s": 12.0,
           "exactly_once": True, "samples_twice": 0, "samples_lost": 0,
           "replicas_equal": True, "finishers": 2, "quarantine": caught}
    assert ("attacker not quarantined (first corrupted round 1; struck: round 1: rank 2 "
            "(w2): far from the center; round 2:") in _potluck_line(run)


def test_time_to_target_is_the_first_eval_at_or_under_it() -> None:
    w = _worker(0, [{"kind": "eval", "at": 105.0, "loss": 3.0},
                    {"kind": "eval", "at": 110.0, "loss": 2.5},
                    {"kind": "eval", "at": 112.0, "loss": 2.4}], [])
    assert fig.time_to_target([w], 2.5, 100.0) == 10.0
    assert fig.time_to_target([w], 1.0, 100.0) is None
    assert fig.loss_curve([w], 100.0)[0] == (5.0, 3.0)


def test_replicas_equal_bitwise() -> None:
    a = {"w": torch.ones(3)}
    assert fig.replicas_equal([a, {"w": torch.ones(3)}]) is True
    assert fig.replicas_equal([a, {"w": torch.ones(3) + 1e-7}]) is False
    assert fig.replicas_equal([]) is None


def test_a_commit_the_lineage_redid_without_its_member_is_not_counted() -> None:
    # Measured (--quick --seed 1): the store's host died in round 2's sync; one member's
    # sync completed (a commit with 3 members), the finisher's failed and it redid the
    # round alone, handing the others' positions out again (round 3). The member, left
    # out of the next generation, died in a round 3 of its own.
    finisher = fig.Worker(0, records=[{**_commit(1), "workers": 3},
                                      {**_commit(2, [[4, 8]]), "workers": 1},
                                      {**_commit(3), "workers": 1},
                                      {"kind": "done", "finished": True}],
                          ledger=[(0, [0, 1]), (0, [2]), (0, [4, 5, 6, 7])],
                          params=Path("final.pt"))
    left = fig.Worker(1, records=[{**_commit(1), "workers": 3}, {**_commit(2), "workers": 3},
                                  {"kind": "pending", "round": 3, "epoch": 0, "ids": [8]}],
                      ledger=[(0, [3]), (0, [4, 5])])
    assert fig.exactly_once([finisher, left], 9, 1) == {"twice": 0, "missing": 1}


def test_a_round_the_finisher_took_from_a_member_that_did_not_finish_is_counted() -> None:
    # Measured (the full run, seed 0): the store's host died in round 2's sync; one
    # member's sync completed (a commit with 3 members), the finisher's failed, and the
    # survivors realigned to the furthest step: the finisher took round 2 from the
    # member (a commit with 2 members that lost nothing). The member then did not finish.
    finisher = fig.Worker(0, records=[{**_commit(1), "workers": 3},
                                      {**_commit(2), "workers": 2},
                                      {**_commit(3), "workers": 2},
                                      {"kind": "done", "finished": True}],
                          ledger=[(0, [0, 1]), (0, [2, 3]), (0, [6, 7])],
                          params=Path("final.pt"))
    member = fig.Worker(1, records=[{**_commit(1), "workers": 3}, {**_commit(2), "workers": 3},
                                    {**_commit(3), "workers": 2}],
                        ledger=[(0, [8]), (0, [4, 5]), (0, [9])])
    assert fig.exactly_once([finisher, member], 10, 1) == {"twice": 0, "missing": 0}


def test_a_line_a_worker_is_still_writing_is_left_for_the_next_read(tmp_path: Path) -> None:
    """The bench reads the logs while the workers write them: a torn last line (an
    unterminated JSON string, as CI saw once) is not read until it is whole."""
    log = tmp_path / "node1-7.log"
    log.write_text('{"kind": "member", "worker": "w1"}\n{"kind": "commit", "ste')
    (tmp_path / "node1-7.jsonl").write_text('[0, [1, 2]]\n[0, [3')
    (worker,) = fig.read_workers(tmp_path)
    assert worker.records == [{"kind": "member", "worker": "w1"}]
    assert worker.ledger == [(0, [1, 2])]
