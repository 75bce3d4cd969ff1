"""``potluck plan``: predict a cohort's throughput per sync mode and choose its members.

    potluck plan CANDIDATES [--reputation PATH] [--calibrate --model module:function]
                 [--inner-steps 10,50,200] [--json PATH]

``CANDIDATES`` is a TOML or JSON file (``candidates.py`` has the format; docs/plan.md
an example). A machine without a speed takes its median measured speed from the
reputation record, else this machine's (``--calibrate``). The command prints every
mode for all the candidates together, the best cohort per mode, and the best choice
with a line for each machine it leaves out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from potluck.errors import ConfigError
from potluck.plan.candidates import Candidates, load
from potluck.plan.machines import Machine, Workload
from potluck.plan.modes import default_modes
from potluck.plan.predict import predict
from potluck.plan.reasons import left_out
from potluck.plan.report import Plan, lines, payload
from potluck.plan.select import Risk, Search, choose, pick
from potluck.reputation import load as load_records
from potluck.reputation import standing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("candidates", help="the candidates file (TOML, or JSON by .json)")
    parser.add_argument("--reputation", metavar="PATH",
                        help="the reputation record potluck run --reputation keeps")
    parser.add_argument("--calibrate", action="store_true",
                        help="measure here what the file leaves out: compute per sample "
                             "(with --model), the reducer's and a round's overheads")
    parser.add_argument("--model", metavar="MODULE:FUNCTION",
                        help="the model to measure: FUNCTION() returns (model, sample)")
    parser.add_argument("--inner-steps", metavar="H,H,...",
                        help="DiLoCo's H to price (default: the file's, else 10,50,200)")
    parser.add_argument("--json", metavar="PATH", help="write the plan as JSON")


def main(args: argparse.Namespace) -> int:
    try:
        plan = make_plan(args)
    except ConfigError as exc:
        print(f"potluck plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(payload(plan), indent=1, default=str))
    print("\n".join(lines(plan)))
    return 0


def make_plan(args: argparse.Namespace) -> Plan:
    cands = load(args.candidates)
    if args.inner_steps:
        cands = replace(cands, inner_steps=_counts(args.inner_steps))
    notes: list[str] = []
    cands = _calibrated(cands, args, notes)
    records = load_records(args.reputation) if args.reputation else []
    now = time.time()
    standings = {e.name: standing(records, e.identity, now) for e in cands.entries}
    machines = []
    for entry in cands.entries:
        speed = entry.speed or standings[entry.name].samples_per_s
        if speed is None:
            raise ConfigError(f"machine {entry.name!r} has no speed: give speed = "
                              "(samples/s), keep a reputation record with its runs, or "
                              "measure this machine with --calibrate --model module:function")
        machines.append(entry.machine(speed))
    if cands.parameters is None:
        raise ConfigError("[job] parameters is missing: give it, or --calibrate --model "
                          "module:function to count them")
    risks = {name: Risk(s.availability, s.losses_per_h, s.excluded, s.note())
             for name, s in standings.items()} if args.reputation else {}
    workload = Workload(cands.parameters, cands.global_batch, cands.bytes_per_param,
                        cands.overheads)
    search = Search(workload, cands.distances, risks, cands.target)
    modes = default_modes(cands.inner_steps)
    choices = tuple(choose(machines, mode, search) for mode in modes)
    best = pick(choices, cands.target)
    notes.insert(0, f"potluck plan: {len(machines)} candidates, {cands.parameters:,} "
                    f"parameters, global batch {cands.global_batch}")
    return Plan(tuple(machines), tuple(predict(machines, workload, m, cands.distances)
                                       for m in modes),
                choices, best, tuple(left_out(machines, best, search)) if best else (),
                cands.target, cands.samples, tuple(notes))


def _calibrated(cands: Candidates, args: argparse.Namespace, notes: list[str]) -> Candidates:
    if not args.calibrate:
        return cands
    if not args.model:
        raise ConfigError("--calibrate measures a model: give --model module:function "
                          "(the function returns (model, sample))")
    from potluck.plan.calibrate import calibrate

    share = max(1, cands.global_batch // len(cands.entries))
    cal = calibrate(args.model, share)
    notes.append(f"measured here: {cal.samples_per_s:.4g} samples/s at {share} a step, "
                 f"{cal.parameters:,} parameters, {cal.step_s * 1e3:.2f} ms a step of the "
                 f"reducer, {cal.round_s * 1e3:.2f} ms a round's outer step, "
                 f"{cal.cpu_s_per_byte * 1e9:.2f} ns of CPU an all-reduced byte")
    entries = tuple(e if e.speed is not None else replace(e, speed=cal.samples_per_s)
                    for e in cands.entries)
    overheads = replace(cands.overheads, step_s=cands.overheads.step_s or cal.step_s,
                        round_s=cands.overheads.round_s or cal.round_s,
                        cpu_s_per_byte=cands.overheads.cpu_s_per_byte or cal.cpu_s_per_byte)
    return replace(cands, entries=entries, overheads=overheads,
                   parameters=cands.parameters or cal.parameters)


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(word) for word in text.split(",") if word.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise ConfigError(f"--inner-steps {text!r}: positive counts, comma-separated, "
                          "e.g. 10,50,200")
    return counts


__all__ = ["Machine", "add_arguments", "main", "make_plan"]
