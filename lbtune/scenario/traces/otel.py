"""OpenTelemetry GenAI spans (an OTLP/JSON export): one trace (``traceId``) = one session.

The document is ``{"resourceSpans": [{"scopeSpans": [{"spans": [span, ...]}]}]}`` (other
keys ignored). A span (``traceId``, ``spanId``: non-empty strings, a span id once per
trace; ``parentSpanId``: empty or absent for a root, else a span of the same trace; times:
nanoseconds since the epoch, an integer or a decimal string, end >= start)::

    {"traceId": "5b8e", "spanId": "051a", "parentSpanId": "8a3c", "name": "chat m",
     "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": 1700000000900000000,
     "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                    {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "9000"}},
                    {"key": "gen_ai.usage.output_tokens", "value": {"intValue": 120}}]}

An attribute's value: the first of ``stringValue``, ``intValue`` (a string or a number),
``doubleValue``, ``boolValue``. ``gen_ai.operation.name`` says what a span is:
``chat``/``text_completion``/``generate_content``: an LLM call, which needs
``gen_ai.usage.input_tokens`` (>= 1; ``gen_ai.usage.prompt_tokens`` also read) and
``gen_ai.usage.output_tokens`` (0 is sent as 1; or ``gen_ai.usage.completion_tokens``),
and may have ``gen_ai.usage.cache_read.input_tokens`` (part of the input tokens) and
``gen_ai.request.model`` (else ``gen_ai.response.model``); ``invoke_agent``/``create_agent``:
an agent; anything else (``execute_tool``, HTTP spans): part of the tree, not a call.

Agents: a call belongs to its nearest agent ancestor. Calls under a topmost agent span (or
under none) are the main agent's (0); those under a nested agent span are a subagent's (1,
2, ... by first call), spawned by the agent of the nearest agent span above that one.
The graph, calls in start order: a call waits for its agent's previous call (a subagent's
first call: the latest call of its parent agent that ended before it started) and the
latest call of each of its subagents it has not waited for yet. A call
waits only for calls that had ended when it was sent (1 ms of clock skew tolerated); when
none had (calls sent in parallel) it waits for what its agent's previous call waited for.
``delay_s`` = its start - the latest end of those (0 within the skew), else its start -
the session's: its earliest span's (seconds = ns / 1e9). Traces without LLM calls are
skipped. Errors name a span by its position in the file (1-based) and the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from lbtune.scenario.limits import MAX_TRACE_TIME_S
from lbtune.scenario.sessionplan import MAX_SESSION_CALLS
from lbtune.scenario.traces.rows import as_int, bad, check_count
from lbtune.scenario.traces.sessiongraph import TraceCall, TraceSession

__all__ = ["AGENT_OPS", "CALL_OPS", "sessions"]

CALL_OPS = frozenset({"chat", "text_completion", "generate_content"})
AGENT_OPS = frozenset({"invoke_agent", "create_agent"})
_OP = "gen_ai.operation.name"
_SCALARS = ("stringValue", "intValue", "doubleValue", "boolValue")
_MAX_NS = int(MAX_TRACE_TIME_S * 1e9)
_SKEW_NS = 1_000_000


@dataclass(frozen=True, slots=True)
class _Span:
    record: int
    trace: str
    span: str
    parent: str
    start: int
    end: int
    op: str
    attrs: dict[str, object]


def sessions(shown: str, doc: object) -> list[TraceSession]:
    """One session per trace of the OTLP/JSON document ``doc`` that holds LLM calls."""
    traces: dict[str, list[_Span]] = {}
    for span in _spans(shown, doc):
        traces.setdefault(span.trace, []).append(span)
    out: list[TraceSession] = []
    calls = 0
    for session in filter(None, (_session(shown, spans) for spans in traces.values())):
        calls += len(session.calls)
        check_count(shown, session.line, calls)
        out.append(session)
    return out


def _list(shown: str, record: int, where: str, raw: object) -> list[object]:
    if not isinstance(raw, list):
        raise bad(shown, record, where, f"expected a list, found {type(raw).__name__}")
    return raw


def _spans(shown: str, doc: object) -> list[_Span]:
    if not isinstance(doc, dict) or "resourceSpans" not in doc:
        raise bad(shown, 1, "resourceSpans", "expected an OTLP/JSON object with resourceSpans")
    out: list[_Span] = []
    for i, rs in enumerate(_list(shown, 1, "resourceSpans", doc["resourceSpans"])):
        where = f"resourceSpans[{i}].scopeSpans"
        scopes = rs.get("scopeSpans", []) if isinstance(rs, dict) else None
        for j, ss in enumerate(_list(shown, len(out) + 1, where, scopes)):
            raw = ss.get("spans", []) if isinstance(ss, dict) else None
            for span in _list(shown, len(out) + 1, f"{where}[{j}].spans", raw):
                out.append(_span(shown, len(out) + 1, span))
    return out


def _span(shown: str, record: int, raw: object) -> _Span:
    if not isinstance(raw, dict):
        raise bad(shown, record, None, f"expected a span object, found {type(raw).__name__}")
    for key in ("traceId", "spanId"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise bad(shown, record, key, f"expected a non-empty string, found {raw.get(key)!r}")
    parent = raw.get("parentSpanId") or ""
    if not isinstance(parent, str):
        raise bad(shown, record, "parentSpanId", f"expected a string, found {parent!r}")
    start = _nanos(shown, record, "startTimeUnixNano", raw.get("startTimeUnixNano"))
    end = _nanos(shown, record, "endTimeUnixNano", raw.get("endTimeUnixNano"))
    if end < start:
        what = f"a negative duration (ends {start - end} ns before it starts)"
        raise bad(shown, record, "endTimeUnixNano", what)
    attrs = _attributes(shown, record, raw.get("attributes"))
    op = str(attrs.get(_OP) or "")
    return _Span(record, raw["traceId"], raw["spanId"], parent, start, end, op, attrs)


def _nanos(shown: str, record: int, field: str, raw: object) -> int:
    """Nanoseconds since the epoch, exactly (a float would round them)."""
    try:
        value = int(raw) if isinstance(raw, int | str) and not isinstance(raw, bool) else -1
    except ValueError:
        value = -1
    if not 0 <= value <= _MAX_NS:
        what = f"expected whole nanoseconds in 0..{_MAX_NS}, found {raw!r}"[:200]
        raise bad(shown, record, field, what)
    return value


def _attributes(shown: str, record: int, raw: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in _list(shown, record, "attributes", [] if raw is None else raw):
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise bad(shown, record, "attributes", f"expected {{key, value}}, found {kv!r}"[:200])
        value = kv["value"] if isinstance(kv.get("value"), dict) else {}
        out[kv["key"]] = next((value[t] for t in _SCALARS if t in value), None)
    return out


def _agent_above(shown: str, spans: list[_Span]) -> dict[str, str]:
    """Each span's nearest agent-span ancestor (``""``: none), checking the parent ids."""
    by_id: dict[str, _Span] = {}
    for s in spans:
        if s.span in by_id:
            raise bad(shown, s.record, "spanId", f"span id {s.span!r} seen twice in its trace")
        by_id[s.span] = s
    above: dict[str, str] = {}
    for s in spans:
        path: list[_Span] = []
        on_path: set[str] = set()
        cur: _Span | None = s
        while cur is not None and cur.span not in above:
            if cur.span in on_path:
                raise bad(shown, cur.record, "parentSpanId", "a cycle in the span graph")
            path.append(cur)
            on_path.add(cur.span)
            if cur.parent and cur.parent not in by_id:
                what = f"a span whose parent is not in the trace ({cur.parent!r})"
                raise bad(shown, cur.record, "parentSpanId", what)
            cur = by_id[cur.parent] if cur.parent else None
        for x in reversed(path):  # a root has none; the others', from their parent
            p = by_id.get(x.parent, x)
            above[x.span] = "" if p is x else p.span if p.op in AGENT_OPS else above[p.span]
    return above


class _Walk:
    """Who waits for whom, as a trace's LLM calls are visited in start order."""

    def __init__(self, ends: list[int]) -> None:
        self.ends = ends
        self.afters: list[tuple[int, ...]] = []  # what each visited call waits for
        self.last: dict[str, int] = {}  # agent -> its latest call
        self.calls: dict[str, list[int]] = {}  # agent -> its calls
        self.children: dict[str, list[str]] = {}  # agent -> its subagents
        self.joined: dict[str, int] = {}  # subagent -> its latest call its parent waited for

    def visit(self, start: int, agent: str, parent: str | None) -> tuple[int, ...]:
        """What the next call (of ``agent``, spawned by ``parent``: None = main) waits for."""
        last, ended = self.last, self._ended
        subs = [c for c in self.children.get(agent, []) if last[c] > self.joined.get(c, -1)]
        own: list[int] = [last[agent]] if agent in last else []
        if not own and parent is not None:  # a subagent's first call
            self.children.setdefault(parent, []).append(agent)
            done = [a for a in self.calls.get(parent, []) if ended(a, start)]
            own = [max(done, key=lambda a: (self.ends[a], a))] if done else []
        kept = [a for a in (*own, *(last[c] for c in subs)) if ended(a, start)]
        self.joined.update((c, last[c]) for c in subs if last[c] in kept)
        # none ended: sent in parallel with its agent's previous call, waits for what that did
        after = tuple(sorted(kept)) if kept or agent not in last else self.afters[last[agent]]
        last[agent] = len(self.afters)
        self.calls.setdefault(agent, []).append(len(self.afters))
        self.afters.append(after)
        return after

    def _ended(self, a: int, start: int) -> bool:
        return self.ends[a] - start <= _SKEW_NS


def _session(shown: str, spans: list[_Span]) -> TraceSession | None:
    """The trace's LLM calls as a session graph (``None``: the trace holds no LLM call)."""
    above = _agent_above(shown, spans)
    llm = sorted((s for s in spans if s.op in CALL_OPS), key=lambda s: (s.start, s.record))
    if not llm:
        return None
    if len(llm) > MAX_SESSION_CALLS:  # before the graph's work; check_session says it again
        what = f"a trace of {len(llm)} LLM calls, more than {MAX_SESSION_CALLS}; split it"
        raise bad(shown, llm[0].record, None, what)
    t0 = min(s.start for s in spans)

    def key(agent_span: str) -> str:  # agents are keyed by span id; "" = the main agent
        return "" if not agent_span or not above[agent_span] else agent_span

    numbers: dict[str, int] = {"": 0}
    parent_of: dict[str, str] = {}
    walk = _Walk([s.end for s in llm])
    calls: list[TraceCall] = []
    for s in llm:
        agent = key(above[s.span])
        if agent not in numbers:
            numbers[agent] = len(numbers)
            parent_of[agent] = key(above[agent])
        after = walk.visit(s.start, agent, parent_of.get(agent))
        end = max((llm[a].end for a in after), default=t0)
        calls.append(_call(shown, s, after, max(0, s.start - end) / 1e9, numbers[agent]))
    return TraceSession(line=llm[0].record, start_s=t0 / 1e9, calls=tuple(calls))


def _call(shown: str, s: _Span, after: tuple[int, ...], delay: float, agent: int) -> TraceCall:
    """The LLM span ``s`` as a call: its tokens (older attribute names also read), model."""
    got: list[int] = []
    for kind, old, least in (("input", "prompt", 1), ("output", "completion", 0)):
        name = f"gen_ai.usage.{kind}_tokens"
        raw = s.attrs.get(name, s.attrs.get(f"gen_ai.usage.{old}_tokens"))
        if raw is None:
            raise bad(shown, s.record, name, f"missing attribute on an LLM span ({s.op!r})")
        got.append(as_int(shown, s.record, name, raw, minimum=least))
    name = "gen_ai.usage.cache_read.input_tokens"
    raw = s.attrs.get(name)
    cached = 0 if raw is None else as_int(shown, s.record, name, raw)
    if cached > got[0]:
        raise bad(shown, s.record, name, f"{cached} cached tokens, more than the input tokens")
    model = s.attrs.get("gen_ai.request.model") or s.attrs.get("gen_ai.response.model")
    model = model if isinstance(model, str) else None
    return TraceCall(s.record, got[0], max(got[1], 1), after, delay, agent, cached, None, model)
