"""The report of ``potluck bench cohort`` from its runs' figures (pure): the printed
lines, the ``--json`` payload, the exit code, and potluck's time to target against
torchrun's.

``versus_torchrun``: potluck's time to the target over torchrun's (the goal: 1/30 or
less). Where torchrun did not reach the target within its limit, the ratio is over the
limit (a bound: the true ratio is smaller), and the goal is potluck within a tenth of it.
Where torchrun gave up before its limit (every agent exited, the job unfinished), there
is no bound: the ratio and whether the goal is met are None.
"""

from __future__ import annotations

from typing import Any

from potluck_lab.bench.cohort_costs import cost_lines
from potluck_lab.bench.cohort_plan import GOAL, HALT_S, CohortConfig, schedule
from potluck_lab.common import table

Run = dict[str, Any]


def versus_torchrun(runs: dict[str, Run]) -> dict[str, Any] | None:
    """potluck's time to target over torchrun's; None where either did not run or
    potluck did not reach the target."""
    ours, theirs = runs.get("potluck"), runs.get("torchrun")
    if ours is None or theirs is None or ours["time_to_target_s"] is None:
        return None
    mine, limit = ours["time_to_target_s"], theirs["limit_s"]
    if theirs["time_to_target_s"] is not None:
        ratio = mine / theirs["time_to_target_s"]
        return {"ratio": ratio, "torchrun_reached": True, "met": ratio <= 1.0 / GOAL}
    if theirs.get("gave_up_s") is not None:  # (no bound: whether it is met is unknown)
        return {"ratio": None, "torchrun_reached": False, "met": None}
    return {"ratio": mine / limit, "torchrun_reached": False, "met": mine <= limit / 10.0}


def _potluck_line(run: Run) -> str:
    t, q, halt = run["time_to_target_s"], run["quarantine"], run.get("halted_at")
    if t is not None:
        reached = f"reached in {t:.1f} s"
    elif halt is None:
        reached = "not reached"
    else:
        reached = f"not reached within its limit of {run['limit_s']:.0f} s"
    if halt is None:
        halted = ""
    elif run.get("halt_missed"):
        halted = f", told to halt after commit {halt} and not ended {HALT_S:g} s later"
    else:
        halted = (f", halted after commit {halt} ({run['epochs']} whole epoch(s) checked "
                  "for samples never trained)")
    return (f"{run['contender']}: target {reached}{halted}"
            f", run {run['wall_s']:.1f} s, exactly once {run['exactly_once']} "
            f"({run['samples_twice']} twice, {run['samples_lost']} lost), replicas equal "
            f"{run['replicas_equal']} ({run['finishers']} finishers)"
            + ("" if q is None else f", attacker out after round {q['round']} "
               f"({q['rounds']} round(s) from its first corrupted one, {q['evidence']})"
               if q["round"] is not None else
               f", attacker not quarantined (first corrupted round {q['first_attack']}; "
               f"struck: {'; '.join(q.get('strikes') or ()) or 'never'})"))


def _torchrun_line(run: Run) -> str:
    t = run["time_to_target_s"]
    gave_up = run.get("gave_up_s")
    reached = (f"reached in {t:.1f} s" if t is not None
               else f"not reached: torchrun gave up after {gave_up:.0f} s (every agent "
               "exited; their logs say why)" if gave_up is not None
               else f"not reached within {run['limit_s']:.0f} s")
    return (f"torchrun: target {reached}, run {run['wall_s']:.1f} s, {run['restarts']} "
            f"restart(s), {run['steps_redone']} steps redone ({run['samples_redone']} "
            f"samples), replicas equal {run['replicas_equal']} ({run['finishers']} finishers)")


def line(run: Run) -> str:
    """One run in a line, printed as it ends."""
    return _torchrun_line(run) if run["contender"] == "torchrun" else _potluck_line(run)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def lines(config: CohortConfig, results: dict[str, Any]) -> list[str]:
    out = [f"faults (seed {config.seed}):"]
    out += [f"  {f.describe()}" for f in schedule(config.seed)]
    rows = [[r["contender"], "-" if r["time_to_target_s"] is None
             else f"{r['time_to_target_s']:.1f}", f"{r['wall_s']:.1f}",
             _cell(r["exactly_once"]), _cell(r["replicas_equal"]),
             "-" if not r["quarantine"] else _cell(r["quarantine"]["rounds"]),
             _cell(r["samples_lost"])] for r in results["runs"]]
    out += ["", *table(["contender", "time to target (s)", "run (s)", "exactly once",
                        "replicas equal", "rounds to quarantine", "samples lost"],
                       rows).splitlines()]
    for r in results["runs"]:
        out.append(f"{r['contender']}: bytes on each link: " + ", ".join(
            f"host {b['host']} ({b['mbit']:g} Mbit/s) sent {b['sent'] / 1e6:.2f} MB, "
            f"received {b['received'] / 1e6:.2f} MB" for b in r["link_bytes"]))
        if r["contender"] == "torchrun":
            out.append("torchrun: steps redone at each fault (since its last checkpoint): "
                       + ", ".join(f"{f['kind']} {f['steps_redone']} ({f['samples_redone']} "
                                   "samples)" for f in r["faults"]))
        else:
            out += _story_lines(r)
    out += _versus_lines({r["contender"]: r for r in results["runs"]})
    return out


def _story_lines(run: Run) -> list[str]:
    """What each fault and link cost a potluck run, and what a person watching it saw."""
    name = run["contender"]
    out = [f"{name}: what each fault and link cost:",
           *cost_lines(run.get("fault_costs", []), run.get("link_costs", []))]
    for shot in run.get("status_shots", []):
        seen = shot["path"] or f"not taken: {shot['problem']}"
        out.append(f"{name}: status page {shot['label']} at {shot['at_s']:.0f} s: {seen}")
    if run.get("plots"):
        out.append(f"{name}: potluck plot: {', '.join(run['plots'])}")
    elif run.get("no_plots"):
        out.append(f"{name}: no plots: {run['no_plots']}")
    return out


def _versus_lines(runs: dict[str, Run]) -> list[str]:
    versus = versus_torchrun(runs)
    if versus is None:
        return []
    mine, limit = runs["potluck"]["time_to_target_s"], runs["torchrun"]["limit_s"]
    met = "met" if versus["met"] else "not met"
    if versus["ratio"] is None:
        return [f"time to target, potluck over torchrun: unknown (torchrun gave up after "
                f"{runs['torchrun']['gave_up_s']:.0f} s, before its limit of {limit:.0f} s; "
                "run it again)"]
    if versus["torchrun_reached"]:
        theirs = runs["torchrun"]["time_to_target_s"]
        return [f"time to target, potluck over torchrun: {versus['ratio']:.3f} "
                f"({theirs / mine:.1f}x sooner; goal {GOAL:g}x: {met})"]
    return [f"time to target, potluck over torchrun: under {versus['ratio']:.3f} (torchrun "
            f"did not reach it within {limit:.0f} s; potluck in {mine:.1f} s, goal a tenth "
            f"of the limit: {met})"]


def payload(config: CohortConfig, results: dict[str, Any]) -> dict[str, Any]:
    runs = {r["contender"]: r for r in results["runs"]}
    ours = [r for r in results["runs"] if r["contender"] != "torchrun"]
    main = runs.get("potluck") or (ours[0] if ours else None)
    q = None if main is None else main["quarantine"]
    versus = None if config.quick else versus_torchrun(runs)
    return {"time_to_target_vs_torchrun": None if versus is None else versus["ratio"],
            "torchrun_reached_target": None if versus is None else versus["torchrun_reached"],
            "time_to_target_goal_met": None if versus is None else versus["met"],
            "exactly_once": all(r["exactly_once"] for r in ours),
            "replicas_equal": all(bool(r["replicas_equal"]) for r in ours),
            "rounds_to_quarantine": None if q is None else q["rounds"],
            "samples_lost": sum(r["samples_lost"] for r in ours),
            "runs": results["runs"], "faults": [vars(f) for f in schedule(config.seed)],
            "config": {k: v for k, v in vars(config).items()}}


def exit_code(results: dict[str, Any]) -> int:
    """1 where a potluck contender lost or repeated a sample or its replicas differ
    (torchrun's figures are measured, not checked)."""
    ok = all(r["exactly_once"] and r["replicas_equal"] and not r.get("halt_missed")
             for r in results["runs"] if r["contender"] != "torchrun")
    return 0 if ok else 1
