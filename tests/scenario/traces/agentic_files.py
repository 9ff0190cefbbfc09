"""Agentic trace files for tests: one plain description of sessions, written in each format.

A session is a dict ``{"calls": [call, ...]}`` with an optional ``"start"`` (seconds on
the trace's clock; default: its first call's start). A call is a dict::

    {"start": 1.0, "end": 1.8, "in": 900, "out": 40}

plus, optionally, ``"agent"`` (0, the default: the main agent; 1, 2, ...: subagents of
the main agent), ``"parent"`` (weka only: the index in ``calls`` of the main call that
spawned this subagent; default: the latest earlier main call), ``"turn"`` (copilot
only: calls with equal turns form one turn, and the gap before a new turn is written as
the user's think time, not a tool batch), ``"cached"`` (prompt tokens served from cache),
``"hash_ids"`` (weka only) and ``"model"``. List the calls in the order they were sent
(starts non-decreasing).

Written as each format reads back (see the parsers' docstrings): a chain of main calls
reads back, in all three formats, as ``after=(k - 1,)`` with ``delay_s`` = the gap
between a call's end and the next one's start, and the first call's ``delay_s`` = its
start minus the session's. ``write(fmt, path, sessions)`` picks the writer by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict

__all__ = ["WRITERS", "Call", "Session", "write", "write_copilot", "write_otel", "write_weka"]

Call = TypedDict(
    "Call",
    {
        "start": float,
        "end": float,
        "in": int,
        "out": int,
        "agent": NotRequired[int],
        "parent": NotRequired[int],
        "turn": NotRequired[int],
        "cached": NotRequired[int],
        "hash_ids": NotRequired[list[int]],
        "model": NotRequired[str],
    },
)


class Session(TypedDict):
    calls: list[Call]
    start: NotRequired[float]


def _start(session: Session) -> float:
    return session.get("start", session["calls"][0]["start"])


def weka_request(call: Call) -> dict[str, Any]:
    """One call as a WEKA request (``dur`` from its end; subagent ``agent`` = ``"a<n>"``)."""
    agent = call.get("agent", 0)
    req: dict[str, Any] = {
        "t": call["start"],
        "dur": call["end"] - call["start"],
        "in": call["in"],
        "out": call["out"],
        "type": "subagent" if agent else "main",
        "stop": "tool_use",
    }
    if agent:
        req["agent"] = f"a{agent}"
    for key in ("parent", "hash_ids", "model"):
        if key in call:
            req[key] = call[key]
    return req


def write_weka(path: Path, sessions: Sequence[Session]) -> Path:
    """``sessions`` as WEKA / AgentX JSON lines (one session a line); returns ``path``."""
    lines = [
        {"session_id": f"s{i}", "t": _start(s), "requests": [weka_request(c) for c in s["calls"]]}
        for i, s in enumerate(sessions)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _attr(key: str, value: object) -> dict[str, Any]:
    kind = "stringValue" if isinstance(value, str) else "intValue"
    return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}


def _span(
    trace: str, span: int, parent: int | None, times: tuple[float, float], op: str
) -> dict[str, Any]:
    return {
        "traceId": trace,
        "spanId": f"{span:016x}",
        "parentSpanId": "" if parent is None else f"{parent:016x}",
        "name": op,
        "startTimeUnixNano": str(round(times[0] * 1e9)),
        "endTimeUnixNano": round(times[1] * 1e9),
        "attributes": [_attr("gen_ai.operation.name", op)],
    }


def otel_spans(i: int, session: Session) -> list[dict[str, Any]]:
    """Session ``i`` as the spans of trace ``i + 1``: a root ``invoke_agent`` span (the main
    agent, from the session's start), one ``invoke_agent`` span under it per subagent, a
    ``chat`` span per call under its agent's span, and an ``execute_tool`` span in each gap
    between two calls of one agent. Span ids: 1 = the root, 1 + n = subagent n, then the
    calls in order, then the tools."""
    trace, calls = f"{i + 1:032x}", session["calls"]
    end = max(c["end"] for c in calls)
    spans = [_span(trace, 1, None, (_start(session), end), "invoke_agent")]
    subs = sorted({c.get("agent", 0) for c in calls} - {0})
    for n in subs:
        mine = [c for c in calls if c.get("agent", 0) == n]
        times = (mine[0]["start"], max(c["end"] for c in mine))
        spans.append(_span(trace, 1 + n, 1, times, "invoke_agent"))
    ids = 2 + max(subs, default=0)
    tools: list[dict[str, Any]] = []
    last: dict[int, Call] = {}
    for k, c in enumerate(calls):
        agent = c.get("agent", 0)
        span = _span(trace, ids + k, 1 + agent, (c["start"], c["end"]), "chat")
        span["attributes"] += [
            _attr("gen_ai.usage.input_tokens", c["in"]),
            {"key": "gen_ai.usage.output_tokens", "value": {"intValue": c["out"]}},
        ]
        if "cached" in c:
            span["attributes"].append(_attr("gen_ai.usage.cache_read.input_tokens", c["cached"]))
        if "model" in c:
            span["attributes"].append(_attr("gen_ai.request.model", c["model"]))
        spans.append(span)
        if agent in last and last[agent]["end"] < c["start"]:
            times = (last[agent]["end"], c["start"])
            tools.append(
                _span(trace, ids + len(calls) + len(tools), 1 + agent, times, "execute_tool")
            )
        last[agent] = c
    return spans + tools


def write_otel(path: Path, sessions: Sequence[Session]) -> Path:
    """``sessions`` as one OTLP/JSON document, one trace per session (:func:`otel_spans`)."""
    spans = [span for i, s in enumerate(sessions) for span in otel_spans(i, s)]
    doc = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {}, "spans": spans}]}]}
    path.write_text(json.dumps(doc, indent=1))
    return path


def copilot_session(i: int, session: Session) -> dict[str, Any]:
    """Session ``i`` as a Copilot-style session: calls grouped in turns by ``turn``, the gap
    between two calls of a turn a tool batch, the gap before a turn its ``user_delay_ms``."""
    if any(c.get("agent", 0) for c in session["calls"]):
        raise ValueError("the copilot format has no subagents")
    turns: list[dict[str, Any]] = []
    prev_end, prev_turn = _start(session), None
    for c in session["calls"]:
        # a call that starts as the last one ends can come out -4e-13 s from the sums
        gap_ms = max(0.0, (c["start"] - prev_end) * 1e3)
        if c.get("turn", 0) != prev_turn:
            turns.append({"user_delay_ms": gap_ms, "llm_calls": [], "tool_batches": []})
        else:
            turns[-1]["tool_batches"].append({"duration_ms": gap_ms, "tools": ["bash"]})
        call: dict[str, Any] = {"prompt_tokens": c["in"], "completion_tokens": c["out"]}
        call["duration_ms"] = (c["end"] - c["start"]) * 1e3
        for key, name in (("cached", "cached_tokens"), ("model", "model")):
            if key in c:
                call[name] = c[key]  # type: ignore[literal-required]
        turns[-1]["llm_calls"].append(call)
        prev_end, prev_turn = c["end"], c.get("turn", 0)
    return {"id": f"s{i}", "start": _start(session), "turns": turns}


def write_copilot(path: Path, sessions: Sequence[Session], *, bare_list: bool = False) -> Path:
    """``sessions`` as a Copilot-style JSON document (``{"sessions": [...]}``, or the bare
    list of sessions with ``bare_list``); only main-agent calls."""
    items = [copilot_session(i, s) for i, s in enumerate(sessions)]
    path.write_text(json.dumps(items if bare_list else {"sessions": items}, indent=1))
    return path


WRITERS: dict[str, Callable[[Path, Sequence[Session]], Path]] = {
    "weka": write_weka,
    "otel": write_otel,
    "copilot": write_copilot,
}


def write(fmt: str, path: Path, sessions: Sequence[Session]) -> Path:
    """``sessions`` written in the agentic trace format ``fmt``; returns ``path``."""
    return WRITERS[fmt](path, sessions)
