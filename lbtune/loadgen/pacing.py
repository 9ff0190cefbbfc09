"""When a load generator's users send: the pure rules of :mod:`lbtune.loadgen.user`.

Kept apart from the Locust user so that code which must not import Locust (the
virtual-time twin, :mod:`lbtune.twin`) follows the very same rules:

* a closed-loop user sends its next request as soon as the previous one ended, unless it
  failed: then it pauses :func:`backoff_s` of its consecutive errors;
* users are started at :func:`spawn_rate` users per second (what :class:`PlanShape`
  asks Locust for), one every ``1 / spawn_rate`` seconds.
"""

from __future__ import annotations

__all__ = ["BACKOFF_BASE_S", "BACKOFF_CAP_S", "backoff_s", "spawn_rate"]

BACKOFF_BASE_S = 0.05
"""Closed loop: the pause after a first failed request."""
BACKOFF_CAP_S = 2.0
"""Closed loop: the longest pause after consecutive failed requests."""


def backoff_s(consecutive_errors: int) -> float:
    """The pause before the next request of a user whose last ``consecutive_errors``
    requests failed: 0, then 50 ms, 100 ms, 200 ms ... capped at 2 s."""
    if consecutive_errors <= 0:
        return 0.0
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0 ** min(consecutive_errors - 1, 30))


def spawn_rate(users: int) -> float:
    """Users started per second when the shape asks for ``users``."""
    return max(100.0, float(users) * 10)
