"""The audit's recomputation from the copies carried in the next step, and its tags: an
audit whose carried copies name different audits is void, never a verdict, unless only
the audited owner's own tag differs (pure)."""

from __future__ import annotations

import math

import pytest
import torch

from potluck.trust import CenteredClip, wire
from potluck.trust.exchange import (
    Agreement,
    AuditPlan,
    Kept,
    audit_agreement,
    audit_difference,
)

OWNERS = (0, 1, 2)
PIECE = 4
WORD = wire.per_word(torch.float32)
REPORT = wire.report_words(len(OWNERS)) * WORD  # values
AUDITED, STEP = 1, 41


def gradients() -> torch.Tensor:
    """Every rank's gradient of the audited step, ``[ranks, PIECE * owners]``."""
    return torch.randn(len(OWNERS), PIECE * len(OWNERS),
                       generator=torch.Generator().manual_seed(7))


def kept(received_rows: list[torch.Tensor]) -> Kept:
    received = torch.cat(received_rows)
    return Kept(mine=torch.zeros(PIECE * len(OWNERS)), received=received, piece=PIECE,
                report=REPORT, owners=OWNERS, senders=OWNERS, weights=torch.ones(3),
                copies=torch.empty(0, PIECE), parameters=())


def audited_step(grads: torch.Tensor, *, lie: float = 0.0) -> Kept:
    """The step as this rank kept it: each owner's aggregate of its slice (owner 1 adds
    ``lie`` to its own), then its report."""
    rows = []
    for k in OWNERS:
        value = CenteredClip().aggregate(grads[:, k * PIECE:(k + 1) * PIECE], torch.ones(3))
        rows.append(torch.cat([value + (lie if k == AUDITED else 0.0), torch.zeros(REPORT)]))
    return kept(rows)


def carried_step(grads: torch.Tensor, tags: dict[int, tuple[int, int]] | None = None) -> Kept:
    """The next step: each owner's row carries its copy of the slice its tag names
    (``tags``: owner -> (audited owner, step); default: the plan's)."""
    rows = []
    for k in OWNERS:
        owner, step = (tags or {}).get(k, (AUDITED, STEP))
        copy = grads[k, owner * PIECE:(owner + 1) * PIECE]
        tag = wire.to_values(torch.tensor([wire.audit_tag(owner, step)]), torch.float32)
        rows.append(torch.cat([torch.zeros(PIECE), torch.zeros(REPORT), copy, tag]))
    return kept(rows)


def plan(grads: torch.Tensor, *, lie: float = 0.0) -> AuditPlan:
    return AuditPlan.of(AUDITED, STEP, {0: audited_step(grads, lie=lie)})


def test_an_honest_owner_recomputes_to_its_aggregate() -> None:
    grads = gradients()
    carried = {0: carried_step(grads)}
    assert audit_agreement(plan(grads), carried) is Agreement.AGREED
    assert audit_difference(plan(grads), carried, CenteredClip()) == pytest.approx(0.0, abs=1e-6)


def test_a_lying_owner_is_seen() -> None:
    grads = gradients()
    assert audit_difference(plan(grads, lie=0.5), {0: carried_step(grads)}, CenteredClip()) > 0.1


@pytest.mark.parametrize("other", [(0, STEP), (AUDITED, STEP - 1)])
def test_copies_tagged_for_another_audit_void_it(other: tuple[int, int]) -> None:
    """Owner 2 picked another audit (the reports it hashed differed): the copies do not
    belong together, and recomputing them would accuse the honest owner 1."""
    grads = gradients()
    carried = {0: carried_step(grads, tags={2: other})}
    assert carried[0].audit_tags()[2] == wire.audit_tag(*other)
    assert audit_agreement(plan(grads), carried) is Agreement.VOID
    assert math.isnan(audit_difference(plan(grads), carried, CenteredClip()))


def test_the_audited_owner_cannot_void_its_own_audit_with_a_bad_tag() -> None:
    """It hashes the same reports, so it knows it is audited: a lying owner that tags
    its carried copy for another audit is mistagged, which is evidence against it."""
    grads = gradients()
    carried = {0: carried_step(grads, tags={AUDITED: (0, STEP)})}
    assert audit_agreement(plan(grads, lie=0.5), carried) is Agreement.MISTAGGED


def test_a_step_that_carried_no_audit_has_no_tags_and_no_copies() -> None:
    empty = kept([torch.cat([torch.zeros(PIECE), torch.zeros(REPORT)]) for _ in OWNERS])
    assert empty.audit_tags() == [] and empty.audit_copies().shape == (3, 0)
    assert audit_agreement(plan(gradients()), {0: empty}) is Agreement.AGREED
    assert math.isnan(audit_difference(plan(gradients()), {0: empty}, CenteredClip()))


def test_audit_tag_refuses_what_it_cannot_hold() -> None:
    assert wire.audit_tag(3, 5) != wire.audit_tag(5, 3)
    with pytest.raises(ValueError, match="out of range"):
        wire.audit_tag(1 << 20, 0)
