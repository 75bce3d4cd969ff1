"""The reputation record: what each worker identity did in past runs, kept in a small
local file across runs (``record.py``), and what it says about a worker now
(``standing.py``, pure). ``potluck run --reputation PATH`` appends to it at the end
of a run; ``potluck plan --reputation PATH`` reads it.
"""

from potluck.reputation.record import RunRecord, append, load
from potluck.reputation.standing import Standing, standing

__all__ = ["RunRecord", "Standing", "append", "load", "standing"]
