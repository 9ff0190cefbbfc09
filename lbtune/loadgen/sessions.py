"""Runs one agent session: each call sent once the calls it waits for ended, plus its delay.

A session (:class:`~lbtune.scenario.sessionplan.SessionPlan`) is a graph of calls. A call
is *due* at ``max(ended_at of its after) + delay_s``, or at the session's start +
``delay_s`` when it waits for nothing; it is sent then, never earlier, and the sender is
told ``due``. Calls whose dependencies have all ended run at once, each in its own
greenlet (a fan-out's subagents in parallel); a call that rejoins a fan-out waits for
the last of them.

How :mod:`lbtune.loadgen.user` sends and records the calls, through one
:class:`~lbtune.loadgen.client.StreamClient` per user (its keep-alive pool opens a
connection per concurrent call):

* **closed loop** (:class:`~lbtune.loadgen.user.AgentUser`): a user's next session is due
  when its previous one ended (after a back-off: when it begins). A call's wait past its
  due time is the user's *idle*, judged like a closed-loop user's (the idle share of
  :mod:`lbtune.loadgen.health`); its record has no ``scheduled_at``, as every
  closed-loop record (its due time is not a schedule: it moves with the cluster);
* **open loop** (:class:`~lbtune.loadgen.user.OpenLoopUser`): session ``i`` is due at
  the plan's arrival ``i``; each call waits for an in-flight slot and records its due
  time as ``scheduled_at``, so its lateness is judged like any open-loop send's.

Two parts: :class:`SessionRun`, the pure bookkeeping (which calls are ready, and when
each is due, from the records of the calls that ended), and :func:`run_session`, the
gevent driver that sleeps until each due time and sends.

Policies:

* **A failed call ends its session.** Once a call's record is not ``ok``, no further call
  of the session is sent: its result is lost to the agent (the rejoin can never happen),
  and sending its other branches would offer load for work that is already wasted. Calls
  already in flight run to their end and are recorded; those never sent are counted in
  :attr:`SessionResult.unsent` (and the caller counts them as abandoned). A closed-loop
  user then backs off as after a failed request and starts its next session.
* **Stopping sends nothing new.** Once ``stopping()`` is true (checked before every send
  and at least every :data:`POLL_S` while waiting for a due time), no call is sent;
  those in flight end (or are cut off by the drain) and are recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from time import time

import gevent
import gevent.pool
import gevent.queue

from lbtune.records.requests import ERROR_OUTCOMES, RequestRecord
from lbtune.scenario.sessionplan import Call, SessionPlan, SessionSource

__all__ = ["POLL_S", "SendCall", "SessionResult", "SessionRun", "is_sessions", "run_session"]

POLL_S = 0.1
"""Longest sleep between two looks at ``stopping()`` while a call waits for its due time."""

SendCall = Callable[[Call, float], RequestRecord | None]
"""Sends ``call`` (due at the given time); its record, or ``None`` when it was not sent
(the generator began stopping while the call waited, e.g. for an in-flight slot)."""


def is_sessions(workload: object) -> bool:
    """Is this workload's traffic sessions (:class:`SessionSource`) rather than requests?"""
    return isinstance(workload, SessionSource)


@dataclass(frozen=True, slots=True)
class SessionResult:
    """What one session did."""

    session: int
    records: tuple[RequestRecord, ...]
    """The calls sent, in the order they ended."""
    failed: bool
    """A call's record was not ``ok``: the session ended there."""
    unsent: int
    """Calls never sent (the session failed, or the generator stopped)."""

    @property
    def error(self) -> bool:
        """A call failed (an error outcome; a call cut off by the test's end is none)."""
        return any(r.outcome in ERROR_OUTCOMES for r in self.records)


class SessionRun:
    """The bookkeeping of one session, pure: which calls are ready and when each is due."""

    def __init__(self, plan: SessionPlan, start: float) -> None:
        for pos, call in enumerate(plan.calls):
            if any(not 0 <= d < pos for d in call.after):
                raise ValueError(
                    f"session {plan.session}, call {pos}: after={call.after} must point to"
                    " earlier calls"
                )
        self.plan = plan
        self.start = start
        self._records: list[RequestRecord | None] = [None] * len(plan.calls)
        self._started = [False] * len(plan.calls)
        self._ended: list[RequestRecord] = []
        self._unsent_seen = False
        self.failed = False

    def ready(self) -> list[tuple[int, Call, float]]:
        """The calls whose dependencies have all ended, not handed out before, as
        (position, call, due); none once the session failed or a call went unsent."""
        if self.failed or self._unsent_seen:
            return []
        out: list[tuple[int, Call, float]] = []
        for pos, call in enumerate(self.plan.calls):
            if self._started[pos]:
                continue
            deps = [self._records[d] for d in call.after]
            if any(r is None for r in deps):
                continue
            base = max((r.ended_at for r in deps if r is not None), default=self.start)
            self._started[pos] = True
            out.append((pos, call, base + call.delay_s))
        return out

    def ended(self, pos: int, rec: RequestRecord | None) -> None:
        """Call ``pos`` ended with ``rec`` (``None``: it was not sent)."""
        self._started[pos] = True
        if rec is None:
            self._unsent_seen = True
            return
        self._records[pos] = rec
        self._ended.append(rec)
        if rec.outcome != "ok":
            self.failed = True

    def result(self) -> SessionResult:
        return SessionResult(
            session=self.plan.session,
            records=tuple(self._ended),
            failed=self.failed,
            unsent=len(self.plan.calls) - len(self._ended),
        )


_Ended = RequestRecord | Exception | None
"""What a call's greenlet hands back: its record, the exception ``send`` raised, or
``None`` (not sent)."""


def run_session(
    plan: SessionPlan,
    send: SendCall,
    *,
    stopping: Callable[[], bool],
    start: float | None = None,
) -> SessionResult:
    """Run ``plan`` from ``start`` (default: now) to its end; blocks this greenlet.

    An exception from ``send`` is raised here (after the other calls were killed). Killed
    (``GreenletExit``), it kills the calls it spawned, which record themselves as cut off,
    and re-raises."""
    run = SessionRun(plan, time() if start is None else start)
    done: gevent.queue.Queue[tuple[int, _Ended]] = gevent.queue.Queue()

    def one(pos: int, call: Call, due: float) -> None:
        ended: _Ended = None
        try:
            if _wait_until(due, stopping):
                ended = send(call, due)
        except Exception as exc:  # handed to the session, raised there
            ended = exc
        finally:
            done.put((pos, ended))

    group = gevent.pool.Group()
    pending = 0
    try:
        while True:
            for pos, call, due in run.ready():
                group.spawn(one, pos, call, due)
                pending += 1
            if pending == 0:
                return run.result()
            pos, ended = done.get()
            pending -= 1
            if isinstance(ended, Exception):
                raise ended
            run.ended(pos, ended)
    finally:
        group.kill(block=True)


def _wait_until(due: float, stopping: Callable[[], bool]) -> bool:
    """Sleep until ``due``; False as soon as ``stopping()`` is (then nothing is sent)."""
    while not stopping():
        left = due - time()
        if left <= 0:
            return True
        gevent.sleep(min(POLL_S, left))
    return False
