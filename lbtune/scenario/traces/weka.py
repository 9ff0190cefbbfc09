"""WEKA / AgentX agent traces: JSON lines, one agent session a line.

A line is ``{"session_id": ..., "t": 12.5, "requests": [request, ...]}``. ``requests``
(required, non-empty) lists the session's LLM calls in the order they were sent;
``t`` (optional, seconds on the trace's clock, >= 0) is the session's start, by default
its first request's ``t``; ``session_id`` (optional) is not used. A request::

    {"t": 12.5, "in": 9000, "out": 120, "hash_ids": [11, 12, 13], "type": "main",
     "stop": "tool_use", "agent": "a1", "parent": 0, "dur": 0.9, "model": "m"}

``t`` (seconds, >= the session's start), ``in`` (prompt tokens, >= 1) and ``out``
(output tokens; 0 is sent as 1) are required. Optional: ``type`` (``main``, the default,
or ``subagent``), ``agent`` (a subagent's identity, a string or an integer), ``parent``
(the index in ``requests`` of the main call that spawned a subagent), ``dur`` (the
call's duration in seconds), ``hash_ids`` (prompt blocks by content hash, integers in
0..2**63-1: equal leading ids = a shared prefix), ``stop`` (a string, not used) and
``model``. Other fields are ignored. Example (a main call fans out to two subagents,
which rejoin at the third main call)::

    {"session_id": "s1", "t": 0, "requests": [
      {"t": 0, "dur": 1, "in": 900, "out": 40, "type": "main", "stop": "tool_use"},
      {"t": 1.2, "dur": 2, "in": 300, "out": 20, "type": "subagent", "agent": "a"},
      {"t": 1.5, "dur": 1, "in": 350, "out": 20, "type": "subagent", "agent": "b"},
      {"t": 3, "dur": 0.5, "in": 400, "out": 10, "type": "subagent", "agent": "b"},
      {"t": 4, "dur": 1, "in": 1200, "out": 60, "type": "main", "stop": "end_turn"}]}

The graph (the trace has no edges; these rules make them):

- a main call waits for the main call before it and for the last call of every
  subagent that ran since then (they rejoin); the first main call waits for nothing;
- a subagent's first call waits for its ``parent``, which must be an earlier main call
  of the session (by default the latest one), else "a subagent without a parent"; its
  later calls (same ``agent``) wait for its previous call, ``parent`` then ignored. A
  subagent that already rejoined is spawned anew by its next call. A subagent call
  without ``agent`` is a subagent of its own (one call). Subagents are numbered 1, 2,
  ... in order of appearance;
- the delay (tool time) before a call is ``t - max(t + dur of the calls it waits for)``
  (0 when negative) when every call it waits for has ``dur``; without ``dur`` calls are
  chained with no think time (delay 0), since ``t`` minus the previous ``t`` includes
  the previous call's own run. The first call's delay is its ``t`` minus the session's.

Every call of a session carries the session's line number (errors name it, with the
field as ``requests[k].in``).
"""

from __future__ import annotations

from dataclasses import dataclass

from lbtune.scenario.limits import MAX_HASH_IDS
from lbtune.scenario.sessionplan import MAX_SESSION_CALLS
from lbtune.scenario.traces.rows import as_float, as_int, bad
from lbtune.scenario.traces.sessiongraph import TraceCall, TraceSession

__all__ = ["REQUEST_TYPES", "session"]

REQUEST_TYPES = ("main", "subagent")
_MAX_HASH = 2**63 - 1
_REQUIRED = ("t", "in", "out")


@dataclass(frozen=True, slots=True)
class _Request:
    t: float
    dur: float | None
    prompt_tokens: int
    output_tokens: int
    sub: bool
    agent: str | int | None
    parent: int | None
    hash_ids: tuple[int, ...] | None
    model: str | None


def session(shown: str, line: int, obj: object) -> TraceSession:
    """The session on line ``line`` of ``shown`` (``obj``: that line, JSON-decoded)."""
    if not isinstance(obj, dict):
        raise bad(shown, line, None, f"expected a JSON object, found {type(obj).__name__}")
    raw = obj.get("requests")
    if not isinstance(raw, list) or not raw:
        raise bad(shown, line, "requests", "expected a non-empty list of requests")
    if len(raw) > MAX_SESSION_CALLS:
        raise bad(
            shown,
            line,
            "requests",
            f"a session of {len(raw)} calls, more than the {MAX_SESSION_CALLS} lbtune "
            "replays as one session; split it",
        )
    reqs = [_request(shown, line, k, r) for k, r in enumerate(raw)]
    start = reqs[0].t if obj.get("t") is None else as_float(shown, line, "t", obj["t"])
    for k, r in enumerate(reqs):
        if r.t < start:
            raise bad(shown, line, f"requests[{k}].t", f"{r.t!r} is before the session's t")
    return TraceSession(line=line, start_s=start, calls=tuple(_graph(shown, line, reqs, start)))


def _request(shown: str, line: int, k: int, raw: object) -> _Request:
    col = f"requests[{k}]"
    if not isinstance(raw, dict):
        raise bad(shown, line, col, f"expected a JSON object, found {type(raw).__name__}")
    for key in _REQUIRED:
        if key not in raw:
            raise bad(shown, line, f"{col}.{key}", f"missing field (need {', '.join(_REQUIRED)})")
    kind = raw.get("type", "main")
    if kind not in REQUEST_TYPES:
        raise bad(shown, line, f"{col}.type", f"expected main or subagent, found {kind!r}")
    agent = raw.get("agent")
    if agent is not None and (isinstance(agent, bool) or not isinstance(agent, str | int)):
        raise bad(shown, line, f"{col}.agent", f"expected a string or an integer, found {agent!r}")
    for key in ("stop", "model"):
        if raw.get(key) is not None and not (isinstance(raw[key], str) and raw[key]):
            raise bad(shown, line, f"{col}.{key}", f"expected a string, found {raw[key]!r}")
    parent, dur = raw.get("parent"), raw.get("dur")
    return _Request(
        t=as_float(shown, line, f"{col}.t", raw["t"]),
        dur=None if dur is None else as_float(shown, line, f"{col}.dur", dur),
        prompt_tokens=as_int(shown, line, f"{col}.in", raw["in"], minimum=1),
        output_tokens=max(as_int(shown, line, f"{col}.out", raw["out"]), 1),
        sub=kind == "subagent",
        agent=agent,
        parent=None if parent is None else as_int(shown, line, f"{col}.parent", parent),
        hash_ids=_hash_ids(shown, line, f"{col}.hash_ids", raw.get("hash_ids")),
        model=raw.get("model"),
    )


def _hash_ids(shown: str, line: int, col: str, raw: object) -> tuple[int, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) for h in raw
    ):
        raise bad(shown, line, col, f"expected a list of integers, found {raw!r}"[:200])
    if len(raw) > MAX_HASH_IDS:
        raise bad(shown, line, col, f"more than {MAX_HASH_IDS} block hashes")
    if any(not 0 <= h <= _MAX_HASH for h in raw):
        raise bad(shown, line, col, f"a hash outside 0..{_MAX_HASH}")
    return tuple(raw)


def _graph(shown: str, line: int, reqs: list[_Request], start: float) -> list[TraceCall]:
    """The calls with their edges and delays (the rules in the module's docstring)."""
    numbers: dict[str | int, int] = {}  # subagent identity -> its number
    subagents = 0
    last: dict[int, int] = {}  # agent number -> its latest call
    running: dict[int, None] = {}  # subagents spawned since the latest main call (ordered)
    prev_main: int | None = None
    calls: list[TraceCall] = []
    for k, r in enumerate(reqs):
        agent = 0
        if not r.sub:
            after = () if prev_main is None else (prev_main, *(last[a] for a in running))
            prev_main = k
            running.clear()
        else:
            if r.agent is None or r.agent not in numbers:
                subagents += 1  # a new subagent (one without an identity: every call)
                if r.agent is not None:
                    numbers[r.agent] = subagents
            agent = subagents if r.agent is None else numbers[r.agent]
            if agent in running:
                after = (last[agent],)
            else:
                parent = prev_main if r.parent is None else r.parent
                if parent is None or parent >= k or reqs[parent].sub:
                    raise bad(
                        shown,
                        line,
                        f"requests[{k}].parent",
                        "a subagent without a parent (an earlier main call of the session)",
                    )
                after = (parent,)
                running[agent] = None
            last[agent] = k
        after = tuple(sorted(set(after)))
        calls.append(
            TraceCall(
                line=line,
                prompt_tokens=r.prompt_tokens,
                output_tokens=r.output_tokens,
                after=after,
                delay_s=_delay(reqs, after, r.t, start),
                agent=agent,
                hash_ids=r.hash_ids,
                model=r.model,
            )
        )
    return calls


def _delay(reqs: list[_Request], after: tuple[int, ...], t: float, start: float) -> float:
    if not after:
        return t - start
    end = 0.0
    for a in after:
        dur = reqs[a].dur
        if dur is None:
            return 0.0  # no end time: chained with no think time
        end = max(end, reqs[a].t + dur)
    return max(0.0, t - end)
