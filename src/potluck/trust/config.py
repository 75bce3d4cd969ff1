"""``Trust``: what ``potluck.prepare(trust=...)`` turns on (``docs/trust.md``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from potluck.errors import ConfigError
from potluck.trust.aggregate import Aggregator, CenteredClip
from potluck.trust.round_work import RoundCheck
from potluck.trust.spot import SpotCheck
from potluck.trust.verdict import Rules


@dataclass(frozen=True)
class Trust:
    """Robust aggregation, replica agreement, an audit of the slice owners, quarantine.

    ``aggregator``: ``CenteredClip()`` (default) or ``TrimmedMean(trim)``.
    ``fingerprint_every``: compare the replicas' parameters every K steps (0: never).
    ``audit_every``: on average one step in K (picked from a hash of the step's
    reports, so no owner knows in advance), one owner's slices are audited: in the next
    step every rank's copy of them rides along and every rank recomputes them (bytes:
    ``(N - 1) / N`` of the gradient more in that step; 0: never).
    ``rules``: when evidence becomes quarantine (``potluck.trust.Rules``).
    ``spot_check``: ``SpotCheck(loss)`` has the owners recompute, now and then, one
    rank's gradient on its own samples (off by default: it needs the loss).
    ``round_check``: under rounds, ``RoundCheck(loss)`` checks that each member's
    pseudo-gradient lowers the loss on the data the round assigned it (off by default:
    it needs the loss; ``docs/trust.md``).
    """

    aggregator: Aggregator = field(default_factory=CenteredClip)
    fingerprint_every: int = 1
    audit_every: int = 1
    rules: Rules = field(default_factory=Rules)
    spot_check: SpotCheck | None = None
    round_check: RoundCheck | None = None

    def __post_init__(self) -> None:
        if isinstance(self.aggregator, type) or not isinstance(self.aggregator, Aggregator):
            raise ConfigError(f"Trust(aggregator={self.aggregator!r}): pass an aggregator "
                              "object, potluck.trust.CenteredClip() or TrimmedMean(trim=1)")
        if not (_count(self.fingerprint_every) and self.fingerprint_every >= 0):
            raise ConfigError(f"Trust(fingerprint_every={self.fingerprint_every!r}) must be "
                              "an int >= 0 (steps between replica checks; 0: never)")
        if not (_count(self.audit_every) and self.audit_every >= 0):
            raise ConfigError(f"Trust(audit_every={self.audit_every!r}) must be an int >= 0 "
                              "(one audit per K steps on average; 0: never)")
        if self.spot_check is not None and not isinstance(self.spot_check, SpotCheck):
            raise ConfigError(f"Trust(spot_check={self.spot_check!r}) must be a "
                              "potluck.trust.SpotCheck(loss) or None")
        if self.round_check is not None and not isinstance(self.round_check, RoundCheck):
            raise ConfigError(f"Trust(round_check={self.round_check!r}) must be a "
                              "potluck.trust.RoundCheck(loss) or None")
        if not isinstance(self.rules, Rules):
            raise ConfigError(f"Trust(rules={self.rules!r}) must be a potluck.trust.Rules")


def _count(value: object) -> bool:
    """An int, not a bool (``True`` is an int to Python, not a count to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)
