"""What cannot go together in ``potluck.prepare``: one table, each row with its reason.

``Modes`` is the choice a ``prepare`` call makes on each concern (how replicas are
reconciled, how a step is split, how copies are aggregated, membership, how gradients
travel and weigh). ``refusals(modes)`` returns the rows that forbid it; ``prepare``
raises the first. Everything not in the table composes. ``docs/design.md`` prints the
same table (``table_markdown``), checked by a test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Reconcile = Literal["every step", "rounds", "streaming"]
Split = Literal["equal", "balanced"]  # balanced: by measured speed
Aggregate = Literal["mean", "robust", "spot checks"]  # spot checks: robust, and recomputed
# summing: keeps potluck's weights; codec: CompressedSum(codec), a summing hook whose
# codec trust's exchange can carry the copies through
Hook = Literal["none", "summing", "codec", "own"]


@dataclass(frozen=True)
class Modes:
    """One ``prepare`` call's choice on each concern."""

    reconcile: Reconcile = "every step"  # sync=None, DiLoCo/LocalSGD, StreamingDiLoCo
    split: Split = "equal"  # balance= or --balance (rounds: DiLoCo(adaptive=True))
    shares: bool = False  # shares=: the user's own share policy
    aggregate: Aggregate = "mean"  # trust=
    elastic: bool = False  # potluck run --elastic, or minimum=
    hook: Hook = "none"  # comm_hook=
    tokens: bool = False  # weight=: each rank weighs by its units, not its samples
    micro_batches: bool = False  # a memory cap (max_micro_batch=)
    planned: bool = True  # rounds only: DiLoCo(adaptive=True) and no split=
    bounded: bool = True  # hook "codec": its codec bounds each value's rounding (not TopK)

    @property
    def rounds(self) -> bool:
        return self.reconcile != "every step"


@dataclass(frozen=True)
class Rule:
    """A row: ``when`` the modes hold it, ``what`` is refused, ``why``, and the ``fix``."""

    what: str
    when: Callable[[Modes], bool]
    why: str
    fix: str

    def message(self) -> str:
        return f"prepare() got {self.what}: {self.why}; {self.fix}"


TABLE: tuple[Rule, ...] = (
    Rule("sync=DiLoCo(...) with comm_hook=",
         lambda m: m.rounds and m.hook != "none",
         "a round's pseudo-gradients travel by DiLoCo(codec=...), not by a gradient hook",
         "pass the codec as DiLoCo(codec=...)"),
    Rule("sync=DiLoCo(...) with shares=",
         lambda m: m.rounds and m.shares,
         "a round's split is the sync strategy's plan (by measured speed, or split=)",
         "drop shares=, or give DiLoCo(split=...)"),
    Rule("sync=DiLoCo(...) with weight=",
         lambda m: m.rounds and m.tokens,
         "pseudo-gradients are averaged over workers by their local steps, not by units",
         "drop weight="),
    Rule("balancing (balance= or potluck run --balance) with DiLoCo(adaptive=False) or "
         "DiLoCo(split=...)",
         lambda m: m.rounds and m.split == "balanced" and not m.planned,
         "balanced rounds follow each worker's measured speed, which a fixed plan refuses",
         "use DiLoCo(adaptive=True) (the default) without split=, or drop balancing"),
    Rule("shares= with balancing (balance= or potluck run --balance)",
         lambda m: m.shares and m.split == "balanced",
         "balancing is a share policy: the step has one",
         "use one of them"),
    Rule("comm_hook= with balance= or weight=",
         lambda m: m.hook == "own" and (m.split == "balanced" or m.tokens),
         "those weigh each rank's gradient by its part of the step, which a hook that "
         "weighs by itself would undo",
         "drop one, or use a summing hook (potluck.compress.CompressedSum) that keeps the "
         "weights"),
    Rule("trust=Trust(...) with a comm_hook= other than CompressedSum(codec)",
         lambda m: m.aggregate != "mean" and m.hook in ("summing", "own"),
         "trust aggregates each step's gradients by its own exchange, which can send the "
         "copies through a codec but runs no other hook",
         "pass comm_hook=potluck.compress.CompressedSum(codec), or drop comm_hook="),
    Rule("trust=Trust(spot_check=...) with comm_hook=CompressedSum(TopK(...))",
         lambda m: m.aggregate == "spot checks" and m.hook == "codec" and not m.bounded,
         "a spot check allows a copy its codec's rounding, this step's and the last "
         "step's, and top-k bounds no value's: a value it drops may be any size",
         "use a codec that rounds each value (Int8Blockwise, Int4Blockwise, Fp16, Bf16), "
         "or drop spot_check= (the robust aggregation and the audits stay)"),
    Rule("trust=Trust(spot_check=...) with a memory cap (max_micro_batch=)",
         lambda m: m.aggregate == "spot checks" and m.micro_batches,
         "a spot check recomputes a rank's part in one pass, which micro-batches need not "
         "match (BatchNorm's statistics are per micro-batch)",
         "drop the cap, or the spot checks"),
)


def refusals(modes: Modes) -> list[Rule]:
    """The rows of the table that refuse ``modes`` (empty: they compose)."""
    return [rule for rule in TABLE if rule.when(modes)]


def table_markdown() -> str:
    """The table as docs print it: one row per refusal, with its reason."""
    lines = ["| refused | why | instead |", "|---|---|---|"]
    lines += [f"| {rule.what} | {rule.why} | {rule.fix} |" for rule in TABLE]
    return "\n".join(lines)
