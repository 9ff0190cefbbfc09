"""When the twin's clients send, by the live load generator's rules (:mod:`lbtune.loadgen`).

Closed loop (:class:`~lbtune.loadgen.user.LLMUser` driven by ``PlanShape``): every second
from the start the shape asks for ``plan.users_at(t)`` users; Locust dispatches the new ones
in one batch (the shape asks for :func:`lbtune.loadgen.pacing.spawn_rate` users per second,
never fewer than it adds), so they start together, ``start_gap_s`` apart (a greenlet's start:
~0.25 ms measured), each sending its first request at once; a user sends its next request
as soon as the previous one ended, after
:func:`~lbtune.loadgen.pacing.backoff_s` of its consecutive errors; fewer users asked for
stop the newest ones once their request in flight ended. Every send takes the next request
index (one counter for the generator, in send order). No user sends after the duration.

Open loop (``OpenLoopUser``): request ``i`` is sent at ``plan.arrivals[i]``, whatever is in
flight, unless ``max_in_flight`` requests are outstanding: then it waits for a slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lbtune.loadgen.pacing import backoff_s
from lbtune.scenario.plan import LoadPlan

__all__ = ["ClosedLoop", "User"]


@dataclass
class User:
    uid: int
    errors: int = 0
    """Consecutive failed requests."""
    retired: bool = False
    """Asked to stop: sends nothing more once its request in flight ended."""
    busy: bool = False

    def pause_after(self, failed: bool) -> float:
        """The pause before the next send after a request that ``failed`` (or not)."""
        self.errors = self.errors + 1 if failed else 0
        return backoff_s(self.errors)


@dataclass
class ClosedLoop:
    """The users of a closed-loop plan over time."""

    plan: LoadPlan
    start_gap_s: float = 0.00025
    users: list[User] = field(default_factory=list)
    next_index: int = 0

    @property
    def active(self) -> list[User]:
        return [u for u in self.users if not u.retired]

    def take_index(self) -> int:
        i = self.next_index
        self.next_index += 1
        return i

    def shape(self, t: float) -> list[tuple[float, User]]:
        """The shape's tick at ``t``: the users to start, each with its start time (users
        beyond the target are retired)."""
        target = max(0, int(self.plan.users_at(t)))
        active = self.active
        if target < len(active):
            for u in active[target:]:
                u.retired = True
            return []
        out = []
        for k in range(target - len(active)):
            u = User(len(self.users))
            self.users.append(u)
            out.append((t + k * self.start_gap_s, u))
        return out

    def tick_times(self) -> list[float]:
        """When the shape is asked (every second from 0 while the test runs)."""
        n = int(self.plan.duration_s)
        return [float(s) for s in range(n + 1) if s < self.plan.duration_s]
