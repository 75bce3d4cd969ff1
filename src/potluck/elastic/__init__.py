"""Elastic training: lose a worker mid-run and keep going without a restart.

``ElasticCohort`` (membership + a group per generation), ``ElasticLoader`` (the step's
slice for the current membership), ``ElasticOptimizer`` (apply and commit only a step
whose collectives all succeeded; otherwise recover and let the loader redo the slice).
"""

from potluck.elastic.cohort import ElasticCohort
from potluck.elastic.init import init
from potluck.elastic.loader import ElasticLoader
from potluck.elastic.minimum import MinimumSize
from potluck.elastic.optim import ElasticOptimizer

__all__ = ["ElasticCohort", "ElasticLoader", "ElasticOptimizer", "MinimumSize", "init"]
