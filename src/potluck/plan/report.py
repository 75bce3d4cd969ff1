"""What ``potluck plan`` prints and writes as JSON (pure): the candidates taken all
together per mode, the chosen cohort per mode, and the best choice with the reasons
the others were left out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from potluck.plan.machines import Machine
from potluck.plan.predict import Prediction
from potluck.plan.select import Choice


@dataclass(frozen=True)
class Plan:
    candidates: tuple[Machine, ...]
    together: tuple[Prediction, ...]  # every candidate, per mode
    choices: tuple[Choice | None, ...]  # per mode (None: none meets the target)
    best: Choice | None
    left_out: tuple[str, ...]
    target: float | None
    samples: float | None
    notes: tuple[str, ...] = ()


def lines(plan: Plan) -> list[str]:
    rows = [[p.mode, f"{p.period_s:.4g}", f"{p.samples_per_s:.4g}",
             f"{p.scaling_efficiency:.1%}", f"{p.utilization:.1%}",
             f"{p.bytes_per_sample:.4g}"] for p in plan.together]
    out = [*plan.notes, f"all {len(plan.candidates)} candidates together:",
           _table(["mode", "step or round s", "samples/s", "scaling eff.", "compute util.",
                   "bytes/sample"], rows), "", "the best cohort per mode:"]
    chosen = []
    for choice, alone in zip(plan.choices, plan.together, strict=True):
        if choice is None:
            chosen.append([alone.mode, "none meets the target", "-", "-", "-"])
            continue
        chosen.append([choice.mode.name, " ".join(m.name for m in choice.members),
                       f"{choice.expected:.4g}", f"{choice.prediction.scaling_efficiency:.1%}",
                       "-" if choice.price_per_h is None else f"{choice.price_per_h:.2f}"])
    out.append(_table(["mode", "members", "expected samples/s", "scaling eff.", "price/h"],
                      chosen))
    out.append("")
    best = plan.best
    if best is None:
        out.append("no cohort meets the target" + (
            f" of {plan.target:.4g} samples/s" if plan.target else ""))
        return out
    said = (f"best: {best.mode.name} with {len(best.members)} of {len(plan.candidates)} "
            f"({' '.join(m.name for m in best.members)}): {best.expected:.4g} samples/s")
    if plan.samples:
        said += f", {plan.samples:.4g} samples in {plan.samples / best.expected / 3600:.3g} h"
    out.append(said)
    out += [f"  left out {line}" for line in plan.left_out]
    return out


def payload(plan: Plan) -> dict[str, Any]:
    def choice(c: Choice | None) -> dict[str, Any] | None:
        return None if c is None else {
            "mode": c.mode.name, "members": [m.name for m in c.members],
            "expected_samples_per_s": c.expected, "price_per_h": c.price_per_h,
            "prediction": vars(c.prediction)}

    return {"candidates": [vars(m) for m in plan.candidates],
            "together": [vars(p) for p in plan.together],
            "choices": [choice(c) for c in plan.choices], "best": choice(plan.best),
            "left_out": list(plan.left_out), "target_samples_per_s": plan.target,
            "notes": list(plan.notes)}


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    cells = [list(headers), *[list(r) for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    text = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w)
                      in enumerate(zip(row, widths, strict=True))).rstrip() for row in cells]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)
