"""Coding-agent sessions (Copilot-style): a JSON document of sessions made of turns.

The document is ``{"sessions": [session, ...]}`` or the list of sessions itself. A
session::

    {"id": "s1", "start": 0.0, "turns": [
      {"user_delay_ms": 0,
       "llm_calls": [{"prompt_tokens": 9000, "completion_tokens": 120, "cached_tokens": 8000},
                     {"prompt_tokens": 9400, "completion_tokens": 80, "model": "m"}],
       "tool_batches": [{"duration_ms": 700, "tools": ["grep"]}]},
      {"user_delay_ms": 15000, "llm_calls": [{"prompt_tokens": 9600, "completion_tokens": 300}]}]}

``turns`` is required; ``start`` (seconds on the trace's clock, >= 0) defaults to 0;
``id`` is not used. A turn's ``llm_calls`` (required, possibly empty) hold
``prompt_tokens`` (>= 1) and ``completion_tokens`` (0 is sent as 1), and optionally
``cached_tokens`` (<= the prompt), ``model`` and ``duration_ms`` (checked, not used: the
replay times the call itself). Its ``tool_batches`` (optional) hold ``duration_ms``
(required; ``tools`` and other keys ignored), and ``user_delay_ms`` (optional, default 0)
is the user's think time before the turn. Durations are >= 0 (a negative one is an
error). Other keys are ignored.

The graph is one chain (no subagents: agent 0): every call waits for the call before it
(the first for nothing) with ``delay_s`` = the time in between: within a turn, tool batch
k runs between calls k and k+1; the batches left after a turn's last call, then the next
turn's ``user_delay_ms``, run before the next turn's first call (a turn without calls
adds its batches and delay to that wait too). The first call's delay is the first turn's
``user_delay_ms`` (from ``start``); batches after the session's last call are dropped.

Errors name the session by its position in the document (1-based, the record) and the
field inside it (``turns[0].llm_calls[1].prompt_tokens``); every call of a session
carries that record number.
"""

from __future__ import annotations

from lbtune.scenario.limits import MAX_TRACE_ROWS, MAX_TRACE_TIME_S
from lbtune.scenario.sessionplan import MAX_SESSION_CALLS
from lbtune.scenario.traces.rows import as_float, as_int, bad, check_count
from lbtune.scenario.traces.sessiongraph import TraceCall, TraceSession

__all__ = ["sessions"]

_MAX_MS = MAX_TRACE_TIME_S * 1e3


def sessions(shown: str, doc: object) -> list[TraceSession]:
    """Every session of the document ``doc`` (decoded JSON), in file order."""
    raw = doc.get("sessions") if isinstance(doc, dict) else doc
    if not isinstance(raw, list):
        raise bad(shown, 1, "sessions", 'expected a list of sessions (or {"sessions": [...]})')
    if len(raw) > MAX_TRACE_ROWS:
        raise bad(shown, 1, "sessions", f"more than {MAX_TRACE_ROWS} sessions; split the file")
    out: list[TraceSession] = []
    calls = 0
    for record, obj in enumerate(raw, start=1):
        session = _session(shown, record, obj)
        calls += len(session.calls)
        check_count(shown, record, calls)
        out.append(session)
    return out


def _items(shown: str, record: int, field: str, raw: object) -> list[dict[str, object]]:
    """``raw`` as a list of JSON objects, else a ConfigError naming ``field``."""
    if not isinstance(raw, list):
        raise bad(shown, record, field, f"expected a list, found {type(raw).__name__}")
    for k, item in enumerate(raw):
        if not isinstance(item, dict):
            raise bad(shown, record, f"{field}[{k}]", f"expected an object, found {item!r}"[:200])
    return raw


def _ms(shown: str, record: int, field: str, raw: object) -> float:
    """A duration in milliseconds (>= 0), as seconds."""
    return as_float(shown, record, field, raw, maximum=_MAX_MS) / 1e3


def _session(shown: str, record: int, obj: object) -> TraceSession:
    if not isinstance(obj, dict):
        raise bad(shown, record, None, f"expected a session object, found {type(obj).__name__}")
    if "turns" not in obj:
        raise bad(shown, record, "turns", "missing field (a session needs its turns)")
    start = as_float(shown, record, "start", obj.get("start", 0.0))
    calls: list[TraceCall] = []
    wait = 0.0  # seconds of tools and user think time since the latest call
    for t, turn in enumerate(_items(shown, record, "turns", obj["turns"])):
        col = f"turns[{t}]"
        wait += _ms(shown, record, f"{col}.user_delay_ms", turn.get("user_delay_ms", 0))
        raw = _items(shown, record, f"{col}.tool_batches", turn.get("tool_batches", []))
        batches = [
            _ms(shown, record, f"{col}.tool_batches[{k}].duration_ms", b.get("duration_ms"))
            for k, b in enumerate(raw)
        ]
        raw = _items(shown, record, f"{col}.llm_calls", turn.get("llm_calls"))
        if len(calls) + len(raw) > MAX_SESSION_CALLS:
            what = f"more than {MAX_SESSION_CALLS} calls in one session; split it"
            raise bad(shown, record, f"{col}.llm_calls", what)
        for k, call in enumerate(raw):
            prompt, output, cached, model = _call(shown, record, f"{col}.llm_calls[{k}]", call)
            after = (len(calls) - 1,) if calls else ()
            calls.append(TraceCall(record, prompt, output, after, wait, 0, cached, None, model))
            wait = batches[k] if k < len(batches) else 0.0
        wait += sum(batches[len(raw) :])
    return TraceSession(line=record, start_s=start, calls=tuple(calls))


def _call(
    shown: str, record: int, col: str, raw: dict[str, object]
) -> tuple[int, int, int, str | None]:
    """An LLM call's prompt, output and cached tokens and its model."""
    for key in ("prompt_tokens", "completion_tokens"):
        if key not in raw:
            raise bad(shown, record, f"{col}.{key}", "missing field")
    prompt = as_int(shown, record, f"{col}.prompt_tokens", raw["prompt_tokens"], minimum=1)
    output = as_int(shown, record, f"{col}.completion_tokens", raw["completion_tokens"])
    cached = as_int(shown, record, f"{col}.cached_tokens", raw.get("cached_tokens", 0))
    if cached > prompt:
        raise bad(shown, record, f"{col}.cached_tokens", f"{cached}, more than the prompt_tokens")
    if raw.get("duration_ms") is not None:
        _ms(shown, record, f"{col}.duration_ms", raw["duration_ms"])
    model = raw.get("model")
    if model is not None and not (isinstance(model, str) and model):
        raise bad(shown, record, f"{col}.model", f"expected a model name, found {model!r}")
    return prompt, max(output, 1), cached, model
