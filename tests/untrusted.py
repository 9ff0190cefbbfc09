"""A study that could not measure: the one honest failure of a tiny study on a busy machine.

On a machine whose cores the suite's other workers keep busy, the load generator may read
too many first tokens late to vouch for a TTFT figure (``lbtune.loadgen.health``); such a
trial is re-run once and then failed, and a two-trial study whose every trial failed that
way applies nothing and ends with exit 3, as it must. Tests that run such a tiny study (the
nightly job's steps, the installed wheel) let that one outcome through and go on with the
steps after it; nothing else.
"""

from __future__ import annotations

import re

__all__ = ["untrusted_study"]


def untrusted_study(returncode: int, stderr: str) -> bool:
    """Exit 3, nothing applied, every trial failed, and each failure was the load
    generator's timing not trusted."""
    tallies = re.findall(r"(\d+)/(\d+) done, \d+ pruned, (\d+) failed", stderr)
    untrusted = len(re.findall(r"trial \d+: the measurement is not trusted", stderr))
    if returncode != 3 or "nothing applied" not in stderr or not tallies:
        return False
    done, budget, failed = map(int, tallies[-1])
    return done == budget == failed and untrusted >= failed
