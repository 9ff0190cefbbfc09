"""Agent traces as session graphs: what every agentic trace format parses into.

Three formats record agent sessions rather than independent requests (``weka``: WEKA /
AgentX JSON lines, ``otel``: OpenTelemetry GenAI spans, ``copilot``: coding-agent
sessions; see ``docs/scenarios.md``). Each parser turns a file into
:class:`TraceSession` values: a session's LLM calls in topological order, each naming
the calls it waited for (``after``) and the tool time between the last of them ending
and its own send (``delay_s``). :func:`check_session` is the one validation of the
graph every parser calls (cycles, a parent that does not exist, negative or
non-finite durations): one :class:`~lbtune.errors.ConfigError` naming the file, the
line (or record) and the field.

A replay (:class:`lbtune.scenario.traces.sessions.TraceSessionWorkload`) turns a
:class:`TraceSession` into a :class:`~lbtune.scenario.sessionplan.SessionPlan`: the
generator then sends call k when its ``after`` calls ended plus ``delay_s``, exactly as
for the built-in ``agent`` scenario; sessions start at their recorded ``start_s``
(open loop, divided by the source's ``speedup``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lbtune.scenario.sessionplan import MAX_SESSION_CALLS
from lbtune.scenario.traces.rows import bad

__all__ = ["SESSION_FORMATS", "TraceCall", "TraceSession", "check_session"]

SESSION_FORMATS: tuple[str, ...] = ("weka", "otel", "copilot")
"""Trace formats whose unit is an agent session (replayed as causal sessions)."""


@dataclass(frozen=True, slots=True)
class TraceCall:
    """One LLM call of a recorded agent session."""

    line: int
    """1-based line (JSON lines) or record number (JSON documents) that holds the call:
    errors name it, and it keys the call's synthesized text."""
    prompt_tokens: int
    """The whole prompt the call sent (its context included)."""
    output_tokens: int
    after: tuple[int, ...]
    """Positions (in :attr:`TraceSession.calls`, all smaller) of the calls that had to
    end before this one was sent; empty = sent at the session's start (plus ``delay_s``)."""
    delay_s: float
    """Seconds between the last of ``after`` ending (the session's start if none) and
    this call's send: the tool's run, or the user's think time."""
    agent: int = 0
    """0 = the session's main agent; 1, 2, ... = its subagents, in order of appearance."""
    cached_tokens: int = 0
    """Leading prompt tokens the trace says were served from a prefix cache (0: unknown)."""
    hash_ids: tuple[int, ...] | None = None
    """Prompt blocks by content hash (WEKA/AgentX): equal leading ids = a shared prefix."""
    model: str | None = None


@dataclass(frozen=True, slots=True)
class TraceSession:
    """One recorded agent session."""

    line: int
    """Where the session begins in the file (its first call's line or record)."""
    start_s: float
    """The session's start on the trace's own clock, in seconds (>= 0, finite)."""
    calls: tuple[TraceCall, ...]


def check_session(path: str, session: TraceSession) -> None:
    """Raise a ConfigError (``file:line: field: what``) unless ``session`` is a replayable
    graph: 1..MAX_SESSION_CALLS calls, every ``after`` pointing at an earlier call (a
    parser that found a later or unknown parent reports it as a cycle or a missing parent
    before building the session), finite non-negative delays and start."""
    if not session.calls:
        raise bad(path, session.line, None, "a session without LLM calls")
    if len(session.calls) > MAX_SESSION_CALLS:
        raise bad(
            path,
            session.line,
            None,
            f"a session of {len(session.calls)} calls, more than the {MAX_SESSION_CALLS} "
            "lbtune replays as one session; split it",
        )
    if not (math.isfinite(session.start_s) and session.start_s >= 0):
        raise bad(
            path, session.line, "start", f"must be a finite time >= 0, found {session.start_s!r}"
        )
    for k, call in enumerate(session.calls):
        if not (math.isfinite(call.delay_s) and call.delay_s >= 0):
            raise bad(
                path, call.line, "delay", f"a negative or non-finite duration ({call.delay_s!r} s)"
            )
        for a in call.after:
            if not 0 <= a < k:
                raise bad(
                    path,
                    call.line,
                    "parent",
                    f"waits for call {a}, which is not an earlier call of its session "
                    "(a cycle, or a parent that is not in the trace)",
                )
