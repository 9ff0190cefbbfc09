"""The causal structure of an agent session: which call waits for which, and how long.

An agent session (:mod:`lbtune.scenario.agent`) is a small graph of LLM calls. A call
is sent when every call it waits for (``after``) has *ended*, plus its tool delay:
turn t+1 of a chain waits for turn t's answer and the tool run it asked for; a
subagent's first call waits for the parent call that spawned it; the parent's call
after a fan-out waits for the last call of every subagent (they rejoin). Only the
send times depend on the cluster; what is sent (request ``index``'s content) is a
pure function of the scenario's seed and ``index``, like every other workload.

Request indices: call ``k`` (position in :attr:`SessionPlan.calls`) of session ``s``
is request ``s * MAX_SESSION_CALLS + k``, so any process computes any call alone, and
a record's ``index`` names its session and position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from lbtune.scenario.request import RequestSpec

__all__ = ["MAX_SESSION_CALLS", "Call", "SessionPlan", "SessionSource", "call_index", "split"]

MAX_SESSION_CALLS = 4096
"""Calls one session may hold (subagents' calls included): the index stride."""


@dataclass(frozen=True, slots=True)
class Call:
    """One LLM call of a session."""

    index: int
    """The request index: ``workload.request(index)`` is what is sent."""
    after: tuple[int, ...]
    """Positions (in :attr:`SessionPlan.calls`, all smaller than this call's) of the
    calls that must have ended before this one is sent; empty = the session's start."""
    delay_s: float
    """The tool delay: sent no earlier than the last of ``after`` ended plus this (from
    the session's start for a call with no ``after``)."""
    agent: int = 0
    """0 = the session's main agent; 1, 2, ... = its subagents, in spawn order."""


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """One session's calls in topological order (every ``after`` points backwards)."""

    session: int
    calls: tuple[Call, ...]


@runtime_checkable
class SessionSource(Protocol):
    """A workload whose traffic is sessions (:class:`lbtune.scenario.agent.AgentWorkload`,
    :class:`lbtune.scenario.traces.sessions.TraceSessionWorkload`)."""

    def session(self, s: int) -> SessionPlan:
        """Session ``s`` (0-based); identical in every process for the same seed."""
        ...

    def request(self, i: int) -> RequestSpec:
        """Request ``i`` = call ``i % MAX_SESSION_CALLS`` of session ``i // MAX_SESSION_CALLS``."""
        ...


def call_index(session: int, position: int) -> int:
    """The request index of call ``position`` of ``session``."""
    if not 0 <= position < MAX_SESSION_CALLS:
        raise IndexError(f"call {position} of a session: at most {MAX_SESSION_CALLS} calls")
    return session * MAX_SESSION_CALLS + position


def split(index: int) -> tuple[int, int]:
    """(session, position) of a request index."""
    return divmod(index, MAX_SESSION_CALLS)
