"""Trust: robust aggregation inside the all-reduce's split, replica agreement, an audit
of the slice owners, and quarantine with evidence (``docs/trust.md``).

    model, opt, loader = potluck.prepare(model, opt, data, global_batch=64,
                                         trust=potluck.Trust())
"""

from potluck.trust.aggregate import Aggregator, CenteredClip, TrimmedMean
from potluck.trust.config import Trust
from potluck.trust.part import TrustPart
from potluck.trust.round_part import RoundTrustPart
from potluck.trust.round_work import RoundCheck
from potluck.trust.spot import SpotCheck
from potluck.trust.verdict import Evidence, Rules

__all__ = ["Aggregator", "CenteredClip", "Evidence", "RoundCheck", "RoundTrustPart", "Rules",
           "SpotCheck", "TrimmedMean", "Trust", "TrustPart"]
