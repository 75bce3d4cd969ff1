"""Why a candidate was left out, in words (pure).

Each left-out machine is priced by adding it to the chosen cohort: the loss in
expected throughput is the figure. The cause is found by asking what would have to
change for it to help: its link (as fast as the cohort's slowest), its record (a
clean one), or nothing (its speed does not pay for a wider ring). A machine the mode
keeps out by distance or by its record says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from potluck.plan.groups import nearest_s
from potluck.plan.machines import Machine
from potluck.plan.select import Choice, Risk, Search, expected


def left_out(candidates: Sequence[Machine], choice: Choice, search: Search) -> list[str]:
    """One line per candidate not in ``choice``, in the candidates' order."""
    chosen = {m.name for m in choice.members}
    return [f"{m.name}: {reason(m, choice, search)}" for m in candidates
            if m.name not in chosen]


def reason(machine: Machine, choice: Choice, search: Search) -> str:
    risk = search.risk(machine)
    if risk.excluded is not None:
        return risk.excluded
    members = list(choice.members)
    far = nearest_s(machine, members, search.distances)
    if not choice.mode.rounds and far > search.close_s:
        return (f"{far * 1e3:.0f} ms from the cohort; a cohort that syncs every step stays "
                f"within {search.close_s * 1e3:.0f} ms")
    added = expected([*members, machine], choice.mode, search)
    if search.target is not None and added.expected >= search.target:
        return _not_needed(choice, added)
    cost = 1.0 - added.expected / choice.expected
    share = f"{abs(cost):.0%}"
    slowest = min(members, key=lambda m: m.goodput)
    if machine.goodput < slowest.goodput:
        fixed = replace(machine, up_bps=max(machine.up_bps, slowest.up_bps),
                        down_bps=max(machine.down_bps, slowest.down_bps))
        if expected([*members, fixed], choice.mode, search).expected > choice.expected:
            return f"its {_link(machine)} would cost the cohort {share}"
    if risk != Risk():
        clean = Search(search.workload, search.distances,
                       {**search.risks, machine.name: Risk()}, search.target,
                       search.close_s, search.recovery_s)
        if expected([*members, machine], choice.mode, clean).expected > choice.expected:
            return f"its record ({risk.note or 'losses'}) would cost the cohort {share}"
    return (f"its {machine.speed:.3g} samples/s add less than a wider ring costs: it "
            f"would cost the cohort {share}")


def _link(machine: Machine) -> str:
    up, down = machine.up_bps, machine.down_bps
    which, rate = ("uplink", up) if up <= down else ("downlink", down)
    return f"{_rate(rate)} {which}"


def _rate(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.3g} bit/s"


def _not_needed(choice: Choice, added: Choice) -> str:
    if choice.price_per_h is not None and added.price_per_h is not None:
        return (f"not needed: the cohort meets the target for "
                f"{added.price_per_h - choice.price_per_h:.2f} an hour less")
    return "not needed: the cohort meets the target with fewer machines"
