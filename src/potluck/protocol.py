"""What the ranks of one cohort must run alike to talk: potluck's version and its wire.

``WIRE`` numbers the layout of the messages potluck's collectives exchange (how many
per step, in what order, what each carries). Ranks with another wire would wait on
collectives the others never run, or read each other's bytes wrongly: a hang or
garbage. So ``prepare`` agrees on ``running()`` with every other setting, and a
joiner compares it with the cohort's: a mismatch is a ``ConfigError`` that names both.
Bump ``WIRE`` with every change to what a collective sends (``docs/design.md``). The
agreement's own two gathers (``prepare_checks.agree_everywhere``) never change, so
that any later version is named, not left waiting; versions from before them (which
gathered a word per setting) are not.
"""

from __future__ import annotations

VERSION = "0.1.0"  # the package's (``potluck.__version__``)
# 3: the rounds' work check's copies ride in the round sum's second all-to-all;
# 2: trust's far steps and DiLoCo's partly trained rounds ride in the live state
WIRE = 3


def running() -> str:
    """This process's potluck, as the cohort compares it: version and wire."""
    return f"{VERSION} (wire {WIRE})"


FIX = ("install the same potluck on every worker (`potluck --version` says which; "
       "`pip install` the same version or commit everywhere)")
