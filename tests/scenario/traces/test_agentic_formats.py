"""The agentic trace formats (weka, otel, copilot) read into session graphs: exact edges,
delays, agents and tokens; one-line errors naming file, line (or record) and field; the
format told from a file's first bytes."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbtune.errors import ConfigError
from lbtune.scenario.traces.readsessions import detect_session_format, read_sessions
from lbtune.scenario.traces.sessiongraph import SESSION_FORMATS, TraceSession
from tests.scenario.traces.agentic_files import Call, Session, write, write_copilot
from tests.scenario.traces.conftest import mooncake_text

SUFFIX = {"weka": ".jsonl", "otel": ".json", "copilot": ".json"}

CHAIN: Session = {
    "start": 10.0,
    "calls": [
        {"start": 10.5, "end": 11.0, "in": 900, "out": 40, "cached": 0, "model": "m"},
        {"start": 11.75, "end": 12.0, "in": 1000, "out": 0, "cached": 800},
        {"start": 13.0, "end": 14.0, "in": 1200, "out": 60, "cached": 1000, "turn": 1},
    ],
}
"""Three main calls: 0.5 s after the start, then gaps of 0.75 s and 1 s."""

FAN_OUT: Session = {
    "calls": [
        {"start": 0.0, "end": 1.0, "in": 900, "out": 40},
        {"start": 1.2, "end": 3.2, "in": 300, "out": 20, "agent": 1},
        {"start": 1.5, "end": 2.5, "in": 350, "out": 20, "agent": 2},
        {"start": 3.0, "end": 3.5, "in": 400, "out": 10, "agent": 2},
        {"start": 4.0, "end": 5.0, "in": 1200, "out": 60},
        {"start": 5.5, "end": 6.0, "in": 1300, "out": 30},
    ]
}
"""A main call spawns two subagents (the second makes two calls); both rejoin at call 4."""
FAN_OUT_GRAPH = [
    ((), 0.0, 0),
    ((0,), 0.2, 1),
    ((0,), 0.5, 2),
    ((2,), 0.5, 2),
    ((0, 1, 3), 0.5, 0),
    ((4,), 0.5, 0),
]
"""(after, delay_s, agent) of each call of FAN_OUT."""


_files = itertools.count()


def written(tmp_path: Path, fmt: str, sessions: list[Session]) -> tuple[TraceSession, ...]:
    """``sessions`` written in ``fmt`` to a new file (the read cache keys by path, size and
    mtime, which two quick writes may share) and read back."""
    path = tmp_path / f"t{next(_files)}{SUFFIX[fmt]}"
    return read_sessions(write(fmt, path, sessions), fmt)


def graph(session: TraceSession) -> list[tuple[tuple[int, ...], float, int]]:
    return [(c.after, round(c.delay_s, 9), c.agent) for c in session.calls]


@pytest.mark.parametrize("fmt", SESSION_FORMATS)
def test_a_chain_reads_back_with_its_gaps(tmp_path: Path, fmt: str) -> None:
    (s,) = written(tmp_path, fmt, [CHAIN])
    assert s.start_s == 10.0
    assert graph(s) == [((), 0.5, 0), ((0,), 0.75, 0), ((1,), 1.0, 0)]
    assert [(c.prompt_tokens, c.output_tokens) for c in s.calls] == [
        (900, 40),
        (1000, 1),
        (1200, 60),
    ]
    assert [c.model for c in s.calls] == ["m", None, None]
    if fmt != "weka":  # WEKA records block hashes, not cached counts
        assert [c.cached_tokens for c in s.calls] == [0, 800, 1000]


@pytest.mark.parametrize("fmt", ["weka", "otel"])
def test_a_fan_out_into_two_subagents_rejoins(tmp_path: Path, fmt: str) -> None:
    (s,) = written(tmp_path, fmt, [FAN_OUT])
    assert s.start_s == 0.0
    assert graph(s) == FAN_OUT_GRAPH
    assert [c.prompt_tokens for c in s.calls] == [900, 300, 350, 400, 1200, 1300]


def test_sessions_are_ordered_by_start(tmp_path: Path) -> None:
    late: Session = {"calls": [{"start": 50.0, "end": 51.0, "in": 5, "out": 1}]}
    early: Session = {"calls": [{"start": 2.0, "end": 3.0, "in": 7, "out": 1}]}
    for fmt in SESSION_FORMATS:
        got = written(tmp_path, fmt, [late, early, CHAIN])
        assert [s.start_s for s in got] == [2.0, 10.0, 50.0], fmt
        assert got[0].calls[0].prompt_tokens == 7


# -- weka ----------------------------------------------------------------------------------


def weka_file(tmp_path: Path, *lines: dict[str, Any]) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def req(t: float, **kw: Any) -> dict[str, Any]:
    return {"t": t, "in": 100, "out": 10, **kw}


def test_weka_without_dur_chains_with_no_think_time(tmp_path: Path) -> None:
    line = {"t": 1.0, "requests": [req(3.0, hash_ids=[1, 2**63 - 1]), req(9.0), req(20.0)]}
    (s,) = read_sessions(weka_file(tmp_path, line), "weka")
    assert s.start_s == 1.0 and s.line == 1
    assert graph(s) == [((), 2.0, 0), ((0,), 0.0, 0), ((1,), 0.0, 0)]
    assert s.calls[0].hash_ids == (1, 2**63 - 1) and s.calls[1].hash_ids is None


def test_weka_subagents_by_parent_and_identity(tmp_path: Path) -> None:
    sub = {"type": "subagent", "dur": 1.0}
    reqs = [
        req(0.0, dur=1.0),
        req(2.0, dur=1.0),
        req(3.5, parent=0, agent="x", **sub),  # spawned by call 0, not the latest main
        req(3.6, **sub),  # no identity: a subagent of its own (3), spawned by call 1
        req(5.0, agent="x", **sub),  # x's second call
        req(7.0, dur=1.0),  # rejoins x (4) and the anonymous one (3)
        req(9.0, agent="x", **sub),  # x again after it rejoined: spawned anew by call 5
    ]
    (s,) = read_sessions(weka_file(tmp_path, {"requests": reqs}), "weka")
    assert graph(s) == [
        ((), 0.0, 0),
        ((0,), 1.0, 0),
        ((0,), 2.5, 1),
        ((1,), 0.6, 2),
        ((2,), 0.5, 1),
        ((1, 3, 4), 1.0, 0),
        ((5,), 1.0, 1),
    ]


# -- otel ----------------------------------------------------------------------------------


def span(
    sid: str,
    parent: str,
    times: tuple[int, int],
    op: str = "chat",
    attrs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A span of trace ``t1``; times in ms; a chat span gets 100 input and 10 output tokens
    unless ``attrs`` says otherwise (``None``: the attribute left out)."""
    given = attrs or {}
    if op == "chat":
        given = {"gen_ai.usage.input_tokens": "100", "gen_ai.usage.output_tokens": 10, **given}
    kv = [{"key": "gen_ai.operation.name", "value": {"stringValue": op}}]
    kv += [{"key": k, "value": {"intValue": v}} for k, v in given.items() if v is not None]
    return {
        "traceId": "t1",
        "spanId": sid,
        "parentSpanId": parent,
        "startTimeUnixNano": str(times[0] * 1_000_000),
        "endTimeUnixNano": str(times[1] * 1_000_000),
        "attributes": kv,
    }


def otel_file(tmp_path: Path, *spans: dict[str, Any]) -> Path:
    path = tmp_path / "o.json"
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]}
    path.write_text(json.dumps(doc, indent=1))
    return path


def test_otel_parallel_calls_skew_and_a_subagent_before_any_call(tmp_path: Path) -> None:
    spans = [
        span("root", "", (0, 9000), "invoke_agent"),
        span("sub", "root", (100, 400), "invoke_agent"),
        span("s1", "sub", (100, 300)),  # before the main agent's first call: waits for none
        span("m1", "root", (500, 1500)),  # the main agent's first call rejoins s1
        span("m2", "root", (1000, 1200)),  # sent while m1 ran: waits for what m1 waited for
        span("tool", "root", (1500, 2000), "execute_tool"),
        span("m3", "root", (1999, 2500)),  # m2 ended first (its start order is after m1)
        {**span("other", "", (0, 50), "invoke_agent"), "traceId": "t2"},  # without LLM calls
    ]
    (s,) = read_sessions(otel_file(tmp_path, *spans), "otel")
    assert s.start_s == 0.0 and s.line == 3
    assert [c.line for c in s.calls] == [3, 4, 5, 7]
    assert graph(s) == [((), 0.1, 1), ((0,), 0.2, 0), ((0,), 0.7, 0), ((2,), 0.799, 0)]


def test_otel_tolerates_a_millisecond_of_skew(tmp_path: Path) -> None:
    spans = [
        span("root", "", (0, 9000), "invoke_agent"),
        span("m1", "root", (0, 1000)),
        span("sub", "root", (999, 3000), "invoke_agent"),
        span("s1", "sub", (999, 2000)),  # 1 ms before m1 ended: still waits for it
    ]
    (s,) = read_sessions(otel_file(tmp_path, *spans), "otel")
    assert graph(s) == [((), 0.0, 0), ((0,), 0.0, 1)]


# -- copilot -------------------------------------------------------------------------------


def test_copilot_turns_tool_batches_and_think_time(tmp_path: Path) -> None:
    call = {"prompt_tokens": 100, "completion_tokens": 10}
    turns = [
        {
            "user_delay_ms": 250,
            "llm_calls": [call, call, call],
            "tool_batches": [{"duration_ms": 700}, {"duration_ms": 300, "tools": ["x"]}],
        },
        {"llm_calls": [], "tool_batches": [{"duration_ms": 100}], "user_delay_ms": 50},
        {
            "user_delay_ms": 2000,
            "llm_calls": [call],
            "tool_batches": [{"duration_ms": 5}, {"duration_ms": 6}],
        },
        {"llm_calls": [call]},
    ]
    path = tmp_path / "c.json"
    path.write_text(json.dumps([{"id": "a", "start": 3, "turns": turns}]))  # a bare list
    (s,) = read_sessions(path, "copilot")
    assert s.start_s == 3.0 and s.line == 1
    assert graph(s) == [
        ((), 0.25, 0),
        ((0,), 0.7, 0),
        ((1,), 0.3, 0),
        ((2,), 2.15, 0),  # no batch after call 2; the empty turn's 100 + 50 ms; 2000 ms
        ((3,), 0.011, 0),  # both batches of turn 2 ran after its only call
    ]


def test_copilot_writer_bare_list_reads_back(tmp_path: Path) -> None:
    path = write_copilot(tmp_path / "c.json", [CHAIN], bare_list=True)
    assert graph(read_sessions(path, "copilot")[0]) == [
        ((), 0.5, 0),
        ((0,), 0.75, 0),
        ((1,), 1.0, 0),
    ]


# -- errors --------------------------------------------------------------------------------


def _otel(*spans: dict[str, Any]) -> str:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]}, indent=1)


def _copilot(*turns: dict[str, Any]) -> str:
    return json.dumps({"sessions": [{"turns": [{"llm_calls": []}]}, {"turns": list(turns)}]})


_CALL = {"prompt_tokens": 100, "completion_tokens": 10}
_ROOT = span("r", "", (0, 10), "invoke_agent")

BAD = [
    # (format, content, fragments the one-line error holds)
    (
        "weka",
        '{"requests": [{"t": 0, "in": 1, "out": 1}]}\n{"requests": [\n',
        [":2:", "invalid JSON"],
    ),
    (
        "weka",
        json.dumps({"requests": [req(0, **{"in": "lots"})]}),
        [":1:", "'requests[0].in'", "whole number", "'lots'"],
    ),
    (
        "weka",
        json.dumps({"requests": [req(0), req(1, dur=-0.5)]}),
        [":1:", "'requests[1].dur'", ">= 0", "-0.5"],
    ),
    (
        "weka",
        json.dumps({"requests": [req(0, type="subagent")]}),
        [":1:", "'requests[0].parent'", "a subagent without a parent"],
    ),
    (
        "weka",
        "\n" + json.dumps({"requests": [req(0), req(1, type="subagent", parent=2), req(2)]}),
        [":2:", "'requests[1].parent'", "a subagent without a parent"],
    ),
    (
        "weka",
        json.dumps(
            {
                "requests": [
                    req(0),
                    req(1, type="subagent"),
                    req(2, type="subagent", agent="b", parent=1),
                ]
            }
        ),
        [":1:", "'requests[2].parent'", "a subagent without a parent"],
    ),
    (
        "weka",
        json.dumps({"t": 5, "requests": [req(4)]}),
        [":1:", "'requests[0].t'", "before the session"],
    ),
    (
        "weka",
        json.dumps({"requests": [{"t": 0, "in": 5}]}),
        [":1:", "'requests[0].out'", "missing field"],
    ),
    (
        "weka",
        json.dumps({"requests": [req(0, type="boss")]}),
        [":1:", "'requests[0].type'", "main or subagent"],
    ),
    (
        "weka",
        json.dumps({"requests": [req(0, hash_ids=[-1])]}),
        [":1:", "'requests[0].hash_ids'", "outside"],
    ),
    ("weka", json.dumps({"requests": []}), [":1:", "'requests'", "non-empty list"]),
    ("weka", "", ["the trace holds no sessions"]),
    (
        "otel",
        _otel(_ROOT, span("a", "b", (1, 2)), span("b", "a", (1, 2))),
        [":2:", "'parentSpanId'", "a cycle in the span graph"],
    ),
    (
        "otel",
        _otel(_ROOT, span("a", "a", (1, 2))),
        [":2:", "'parentSpanId'", "a cycle in the span graph"],
    ),
    (
        "otel",
        _otel(_ROOT, span("a", "gone", (1, 2))),
        [":2:", "'parentSpanId'", "a span whose parent is not in the trace", "'gone'"],
    ),
    (
        "otel",
        _otel(_ROOT, span("a", "r", (5, 2))),
        [":2:", "'endTimeUnixNano'", "a negative duration"],
    ),
    (
        "otel",
        _otel(_ROOT, span("a", "r", (1, 2), attrs={"gen_ai.usage.output_tokens": None})),
        [":2:", "'gen_ai.usage.output_tokens'", "missing attribute"],
    ),
    (
        "otel",
        _otel(_ROOT, span("a", "r", (1, 2), attrs={"gen_ai.usage.input_tokens": "lots"})),
        [":2:", "'gen_ai.usage.input_tokens'", "whole number", "'lots'"],
    ),
    (
        "otel",
        _otel(_ROOT, span("a", "r", (1, 2), attrs={"gen_ai.usage.cache_read.input_tokens": 500})),
        [":2:", "'gen_ai.usage.cache_read.input_tokens'", "more than the input"],
    ),
    ("otel", _otel(_ROOT, span("r", "", (1, 2))), [":2:", "'spanId'", "seen twice"]),
    (
        "otel",
        _otel({**_ROOT, "startTimeUnixNano": "soon"}),
        [":1:", "'startTimeUnixNano'", "whole nanoseconds"],
    ),
    ("otel", '{"resourceSpans": [\n {"scopeSpans": []},\n oops]}', [":3:", "invalid JSON"]),
    ("otel", _otel(_ROOT), ["the trace holds no sessions"]),
    ("otel", '{"spans": []}', [":1:", "'resourceSpans'"]),
    ("otel", "", ["the trace holds no sessions"]),
    (
        "copilot",
        _copilot({"llm_calls": [_CALL], "tool_batches": [{"duration_ms": -5}]}),
        [":2:", "'turns[0].tool_batches[0].duration_ms'", ">= 0", "-5"],
    ),
    (
        "copilot",
        _copilot({"user_delay_ms": -1, "llm_calls": [_CALL]}),
        [":2:", "'turns[0].user_delay_ms'", ">= 0"],
    ),
    (
        "copilot",
        _copilot({"llm_calls": [_CALL, {**_CALL, "duration_ms": -3}]}),
        [":2:", "'turns[0].llm_calls[1].duration_ms'", ">= 0"],
    ),
    (
        "copilot",
        _copilot({"llm_calls": [{**_CALL, "completion_tokens": "ten"}]}),
        [":2:", "'turns[0].llm_calls[0].completion_tokens'", "whole number"],
    ),
    (
        "copilot",
        _copilot({"llm_calls": [{**_CALL, "cached_tokens": 101}]}),
        [":2:", "'turns[0].llm_calls[0].cached_tokens'", "more than the prompt"],
    ),
    (
        "copilot",
        _copilot({"llm_calls": [{"prompt_tokens": 5}]}),
        [":2:", "'turns[0].llm_calls[0].completion_tokens'", "missing field"],
    ),
    ("copilot", _copilot({"llm_calls": [_CALL]}), [":1:", "a session without LLM calls"]),
    ("copilot", '{"sessions": [\n{"turns": []},\n{"turns": [}]}', [":3:", "invalid JSON"]),
    ("copilot", '{"sessions": {}}', [":1:", "'sessions'", "a list of sessions"]),
    ("copilot", '{"sessions": []}', ["the trace holds no sessions"]),
    ("copilot", "", ["the trace holds no sessions"]),
]


@pytest.mark.parametrize(("fmt", "content", "fragments"), BAD)
def test_a_bad_file_is_one_line_naming_file_record_and_field(
    tmp_path: Path, fmt: str, content: str, fragments: list[str]
) -> None:
    path = tmp_path / f"bad{SUFFIX[fmt]}"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        read_sessions(path, fmt)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}:"), msg
    for fragment in fragments:
        assert fragment in msg, (fragment, msg)


def test_not_utf8_a_directory_a_missing_file_and_an_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"requests": [\xff]}\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_sessions(path, "weka")
    with pytest.raises(ConfigError, match="not a regular file"):
        read_sessions(tmp_path, "otel")
    with pytest.raises(ConfigError, match="cannot read"):
        read_sessions(tmp_path / "none.json", "copilot")
    with pytest.raises(ConfigError, match="Available: weka, otel, copilot"):
        read_sessions(path, "mooncake")


def test_read_is_cached_until_the_file_changes(tmp_path: Path) -> None:
    path = write("weka", tmp_path / "w.jsonl", [CHAIN])
    first = read_sessions(path, "weka")
    assert read_sessions(path, "weka") is first
    write("weka", path, [CHAIN, FAN_OUT])
    os.utime(path, ns=(1, 1))
    assert len(read_sessions(path, "weka")) == 2


# -- detection -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", SESSION_FORMATS)
def test_each_format_is_detected(tmp_path: Path, fmt: str) -> None:
    path = write(fmt, tmp_path / f"t{SUFFIX[fmt]}", [CHAIN])
    assert detect_session_format(path) == fmt


def test_other_files_are_not_detected(tmp_path: Path) -> None:
    files = {
        "m.jsonl": mooncake_text(5),
        "r.csv": "requests,in,out\n1,2,3\n",
        "e.json": "",
        "s.json": json.dumps([{"conversations": [{"from": "human", "value": '"turns": ['}]}]),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        assert detect_session_format(tmp_path / name) is None, name
    (tmp_path / "b.bin").write_bytes(bytes(range(256)) * 16)
    assert detect_session_format(tmp_path / "b.bin") is None
    with pytest.raises(ConfigError, match="cannot read"):
        detect_session_format(tmp_path / "none.json")
    with pytest.raises(ConfigError, match="not a regular file"):
        detect_session_format(tmp_path)


# -- property ------------------------------------------------------------------------------

_gap = st.integers(min_value=0, max_value=5_000).map(lambda ms: ms / 1e3)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    fmt=st.sampled_from(SESSION_FORMATS),
    steps=st.lists(
        st.tuples(_gap, _gap, st.integers(1, 50_000), st.booleans()), min_size=1, max_size=12
    ),
)
def test_any_chain_reads_back_as_a_chain(
    tmp_path: Path, fmt: str, steps: list[tuple[float, float, int, bool]]
) -> None:
    calls: list[Call] = []
    t = 0.0
    for gap, dur, tokens, new_turn in steps:
        calls.append(
            {
                "start": t + gap,
                "end": t + gap + dur,
                "in": tokens,
                "out": 1,
                "turn": len(calls) if new_turn else 0,
            }
        )
        t += gap + dur
    (s,) = written(tmp_path, fmt, [{"start": 0.0, "calls": calls}])
    assert [c.after for c in s.calls] == [(k - 1,) if k else () for k in range(len(calls))]
    assert [c.delay_s for c in s.calls] == pytest.approx([g for g, *_ in steps], abs=1e-6)
    assert [c.prompt_tokens for c in s.calls] == [c["in"] for c in calls]
