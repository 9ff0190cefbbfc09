"""Agentic traces replayed as causal sessions: the plan of a known session, the selection,
contexts that grow causally, hash-id sharing, repeats, determinism, the load plan, the
twin's refusal and the format guess (sessions built by hand; the last tests read files)."""

from __future__ import annotations

import json
import typing
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lbtune import tokens
from lbtune.cli import app
from lbtune.errors import ConfigError
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions
from lbtune.run.summary import session_calls
from lbtune.scenario import build_workload, load_scenario, plan_load, scenario_from_dict
from lbtune.scenario.loader import trace_ref
from lbtune.scenario.models import Scenario
from lbtune.scenario.prompts import TextSynth
from lbtune.scenario.request import RequestSpec
from lbtune.scenario.sessionplan import Call, SessionSource, call_index
from lbtune.scenario.traces import read as read_mod
from lbtune.scenario.traces import sessions as sessions_mod
from lbtune.scenario.traces.read import guess_format, read_trace
from lbtune.scenario.traces.replay import BlockText
from lbtune.scenario.traces.sessiongraph import TraceCall, TraceSession
from lbtune.scenario.traces.sessions import TraceSessionWorkload, session_replay_of
from lbtune.scenario.traces.spec import FORMATS, TraceFormat
from lbtune.scenario.workload import has_sessions
from lbtune.twin.requests import check_twinnable
from tests.metrics.records import rec

CHAIN = TraceSession(
    line=1,
    start_s=10.0,
    calls=(
        TraceCall(line=1, prompt_tokens=100, output_tokens=20, after=(), delay_s=0.0),
        TraceCall(line=1, prompt_tokens=150, output_tokens=10, after=(0,), delay_s=0.4, agent=1),
        TraceCall(line=1, prompt_tokens=200, output_tokens=10, after=(1,), delay_s=0.2, agent=1),
        TraceCall(line=1, prompt_tokens=400, output_tokens=30, after=(0, 2), delay_s=0.6),
        TraceCall(line=1, prompt_tokens=50, output_tokens=5, after=(3,), delay_s=1.0),
    ),
)
"""Main call 0 fans out to subagent 1 (two calls), which rejoins at main call 3; main call 4
is shorter than call 3 with its answer: a compacted context."""
HASHED = TraceSession(
    line=2,
    start_s=12.0,
    calls=(
        TraceCall(2, 1100, 8, (), 0.0, hash_ids=(1, 2, 3), model="b"),
        TraceCall(2, 1700, 8, (0,), 0.5, hash_ids=(1, 2, 3, 4), model="unserved"),
    ),
)
OTHER = TraceSession(
    line=3, start_s=15.0, calls=(TraceCall(3, 1100, 4, (), 0.0, hash_ids=(1, 2, 9)),)
)
SESSIONS = (CHAIN, HASHED, OTHER)


def _scenario(**source: Any) -> Scenario:
    return scenario_from_dict(
        {
            "seed": 3,
            "source": {"trace": "agents.jsonl", "format": "weka", **source},
            "models": {"a": 1, "b": 1},
        }
    )


@pytest.fixture
def trace(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[TraceSession, ...]]:
    """``read_sessions`` answers ``trace["sessions"]`` (set it to change the trace)."""
    box: dict[str, tuple[TraceSession, ...]] = {"sessions": SESSIONS}
    monkeypatch.setattr(sessions_mod, "read_sessions", lambda path, fmt: box["sessions"])
    return box


def _texts(spec: RequestSpec) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in spec.messages or ()]


def test_the_plan_of_a_known_session(trace: object) -> None:
    w = TraceSessionWorkload(_scenario(speedup=2))
    assert isinstance(w, SessionSource) and len(w) == 3
    plan = w.session(0)
    assert plan.session == 0
    assert plan.calls == (
        Call(call_index(0, 0), (), 0.0, 0),
        Call(call_index(0, 1), (0,), 0.2, 1),  # delays divided by the speedup
        Call(call_index(0, 2), (1,), 0.1, 1),
        Call(call_index(0, 3), (0, 2), 0.3, 0),
        Call(call_index(0, 4), (3,), 0.5, 0),
    )
    assert [c.index for c in w.session(1).calls] == [call_index(1, 0), call_index(1, 1)]
    assert w.replay.offsets == (0.0, 1.0, 2.5)  # (start - first start) / speedup
    assert w.replay.span_s == pytest.approx(2.5 + 1.25)


def test_selection_start_limit_and_rate_scale(trace: dict[str, Any]) -> None:
    assert session_replay_of(_scenario(start=1.5)).sessions == (HASHED, OTHER)
    assert session_replay_of(_scenario(start=1.5, speedup=2)).offsets == (0.25, 1.75)
    assert session_replay_of(_scenario(limit=2)).sessions == (CHAIN, HASHED)
    with pytest.raises(ConfigError, match="no session to replay from start=100 s"):
        session_replay_of(_scenario(start=100))
    many = tuple(
        TraceSession(line=k + 1, start_s=float(k), calls=(TraceCall(k + 1, 10, 2, (), 0.0),))
        for k in range(400)
    )
    trace["sessions"] = many
    kept = session_replay_of(_scenario(rate_scale=0.5)).sessions
    assert 150 < len(kept) < 250  # each session kept with a seeded draw
    sessions_mod._select.cache_clear()
    assert session_replay_of(_scenario(rate_scale=0.5)).sessions == kept  # the same every time
    other = session_replay_of(_scenario(rate_scale=0.5), seed=4).sessions
    assert other != kept
    offsets = session_replay_of(_scenario(rate_scale=0.5)).offsets
    assert offsets[0] == 0.0 and offsets == tuple(x.start_s - kept[0].start_s for x in kept)


def test_contexts_grow_causally(trace: object) -> None:
    w = TraceSessionWorkload(_scenario())
    calls = [_texts(w.request(call_index(0, k))) for k in range(5)]
    specs = [w.request(call_index(0, k)) for k in range(5)]
    for k, spec in enumerate(specs):  # the trace's exact prompt lengths
        assert spec.prompt_tokens == CHAIN.calls[k].prompt_tokens
        assert spec.prompt_tokens == sum(tokens.count(text) for _, text in calls[k])
        assert spec.max_tokens == CHAIN.calls[k].output_tokens
    # The subagent's first call: its parent's prompt, then its own text.
    assert calls[1][: len(calls[0])] == calls[0] and len(calls[1]) == len(calls[0]) + 1
    # Its second call: its first, that call's answer (10 tokens), new text.
    assert calls[2][: len(calls[1])] == calls[1]
    role, answer = calls[2][len(calls[1])]
    assert role == "assistant" and tokens.count(answer) == 10
    # Main call 3: main call 0, its answer (20 tokens), new text (tool output, the
    # subagent's result) up to 400 tokens.
    assert calls[3][:2] == [*calls[0], ("assistant", calls[3][1][1])]
    assert calls[3][1][0] == "assistant" and tokens.count(calls[3][1][1]) == 20
    assert len(calls[3]) == 3 and calls[3][2][0] == "user"
    # Main call 4 (50 tokens < 400 + 30): compacted, a fresh text of its own.
    assert len(calls[4]) == 1 and not calls[4][0][1].startswith(calls[3][0][1][:40])
    assert {s.traffic_class for s in specs} == {"trace"}
    assert [s.turn for s in specs] == list(range(5)) and {s.session_id for s in specs} == {0}
    assert specs[0].body()["ignore_eos"] is True
    with pytest.raises(IndexError):
        w.request(call_index(0, 5))


def test_hash_ids_share_blocks_across_sessions(trace: object) -> None:
    w = TraceSessionWorkload(_scenario())
    first, second = w.request(call_index(1, 0)), w.request(call_index(1, 1))
    other = w.request(call_index(2, 0))
    shared, n = BlockText(TextSynth(), 3, 512).text((1, 2), 1024, (0,))
    assert n == 1024
    texts = [_texts(s)[0][1] for s in (first, second, other)]
    assert all(t.startswith(shared) for t in texts)
    assert texts[0] != texts[2]  # the third block differs
    assert [s.prompt_tokens for s in (first, second, other)] == [1100, 1700, 1100]
    assert first.prefix_group == second.prefix_group == other.prefix_group == 1
    assert first.model == "b"  # served: kept
    assert second.model in ("a", "b")  # not served: drawn (from the scenario's models)
    assert w.request(call_index(0, 0)).prefix_group is None


def test_sessions_repeat_past_the_window_and_are_deterministic(trace: object) -> None:
    w, again = TraceSessionWorkload(_scenario()), TraceSessionWorkload(_scenario())
    n = len(w)
    for s in range(2 * n):
        plan = w.session(s)
        assert plan == again.session(s)
        base = w.session(s % n)
        assert [(c.after, c.delay_s, c.agent) for c in plan.calls] == [
            (c.after, c.delay_s, c.agent) for c in base.calls
        ]
        for k, call in enumerate(plan.calls):
            spec = w.request(call.index)
            assert call.index == call_index(s, k) and spec.session_id == s
            assert spec == again.request(call.index)
            assert spec.body() == w.request(call_index(s % n, k)).body()


def test_the_load_plan_starts_sessions_at_their_offsets(trace: object) -> None:
    sc = _scenario(speedup=2)
    assert has_sessions(sc) and not has_sessions(_scenario().model_copy(update={"source": None}))
    plan = plan_load(sc)
    assert plan.mode == "open" and plan.arrivals == (0.0, 1.0, 2.5)
    assert plan.duration_s == pytest.approx(3.75)  # the span of the starts
    closed = plan_load(sc, users=2, duration_s=30)
    assert closed.mode == "closed" and closed.users_at(10) == 2 and closed.arrivals == ()
    with pytest.raises(ConfigError) as err:
        plan_load(sc, rate=3)
    assert "\n" not in str(err.value) and "--users N to run its sessions back to back" in str(
        err.value
    )
    assert isinstance(build_workload(sc), TraceSessionWorkload)


def test_the_twin_refuses_session_traces_in_one_line(trace: object) -> None:
    from lbtune.scenario.runplan import RunPlan

    plan = typing.cast(RunPlan, type("P", (), {"scenario": _scenario()})())
    with pytest.raises(ConfigError) as err:
        check_twinnable(plan)
    assert str(err.value) == (
        "scenario '' has a weka trace's sessions: the twin cannot screen them yet; "
        "run optimize with --screen 0"
    )


def test_formats_and_the_guess(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert typing.get_args(TraceFormat) == FORMATS
    jsonl, js = tmp_path / "a.jsonl", tmp_path / "a.json"
    jsonl.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\n')
    js.write_text("[]")
    assert guess_format(jsonl) == "mooncake" and guess_format(js) == "sharegpt"
    monkeypatch.setattr(read_mod, "detect_session_format", lambda p: "otel")
    assert guess_format(jsonl) == "otel" and guess_format(js) == "otel"
    with pytest.raises(ConfigError) as err:
        read_trace(jsonl, "weka")
    assert "\n" not in str(err.value) and "read_sessions" in str(err.value)


# -- from a file -----------------------------------------------------------------------


def weka_lines(sessions: int, calls: int = 3, gap: float = 0.5) -> str:
    """``sessions`` WEKA sessions ``gap`` s apart, each ``calls`` main calls whose
    contexts grow, the first fanning out to one subagent of two calls."""
    lines = []
    for s in range(sessions):
        t = s * gap
        reqs: list[dict[str, Any]] = []
        for k in range(calls):
            reqs.append({"t": t, "dur": 0.2, "in": 200 + 150 * k, "out": 20, "type": "main"})
            t += 0.2 + 0.1 * (k + 1)
            if k == 0:
                for j in range(2):
                    sub = {"t": t, "dur": 0.1, "in": 260 + 60 * j, "out": 10, "agent": "x"}
                    reqs.append({**sub, "type": "subagent", "parent": 0})
                    t += 0.1 + 0.05
        lines.append(json.dumps({"session_id": f"s{s}", "t": s * gap, "requests": reqs}))
    return "\n".join(lines) + "\n"


def test_a_weka_file_runs_as_sessions(tmp_path: Path) -> None:
    path = tmp_path / "agents.jsonl"
    path.write_text(weka_lines(4))
    assert guess_format(path) == "weka"
    sc = load_scenario(trace_ref(path))
    assert sc.name == f"trace {path.name} (weka, from 0 s, all sessions, x1 speed)"
    w = build_workload(sc)
    assert isinstance(w, TraceSessionWorkload) and len(w) == 4
    plan = w.session(0)
    assert [c.agent for c in plan.calls] == [0, 1, 1, 0, 0]
    assert plan.calls[3].after == (0, 2)  # the rejoin
    run = plan_run(StressOptions(scenario=trace_ref(path), seed=3))
    assert run.load.duration_s == pytest.approx(2.0)  # 4 starts 0.5 s apart, plus a gap
    records = [
        replace(rec(call_index(s, k), sent=1.0), session_id=s) for s in (0, 2) for k in (0, 1)
    ]
    assert session_calls(run, records) == {0: 5, 2: 5}
    with pytest.raises(ConfigError, match="--users N to run its sessions back to back"):
        plan_run(StressOptions(scenario=trace_ref(path), rate=2))


def test_scenarios_show_previews_the_first_calls(tmp_path: Path) -> None:
    path = tmp_path / "agents.jsonl"
    path.write_text(weka_lines(3))
    res = CliRunner().invoke(app, ["scenarios", "show", str(path), "--json"])
    assert res.exit_code == 0, res.output
    preview = json.loads(res.output)["preview"]
    assert preview["requests"] == 15 and preview["agent"] == {"sessions": 3, "subagent_calls": 6}
    p50 = preview["prompt_tokens"]["p50"]
    assert p50["trace"] == p50["sampled"]  # causal contexts: the trace's exact lengths


def test_cached_tokens_of_a_fresh_call_are_a_context_shared_across_sessions(
    trace: dict[str, tuple[TraceSession, ...]],
) -> None:
    """A first call whose trace says 300 of its tokens came from a cache starts with the
    same 300-token ``system`` context as every other such call, whatever session; its own
    text follows, and the prompt keeps the trace's length. Later calls of the session grow
    from it; a first call without cached tokens has no such context."""
    trace["sessions"] = (
        TraceSession(1, 0.0, (TraceCall(1, 400, 10, (), 0.0, cached_tokens=300),)),
        TraceSession(
            2,
            1.0,
            (
                TraceCall(2, 500, 10, (), 0.0, cached_tokens=300),
                TraceCall(2, 600, 10, (0,), 0.1, cached_tokens=500),
            ),
        ),
        TraceSession(3, 2.0, (TraceCall(3, 400, 10, (), 0.0),)),
    )
    w = TraceSessionWorkload(_scenario())
    a, b, b2, c = (w.request(call_index(s, k)) for s, k in ((0, 0), (1, 0), (1, 1), (2, 0)))
    ta, tb, tb2, tc = (_texts(x) for x in (a, b, b2, c))
    assert ta[0][0] == "system" and ta[0] == tb[0] and tokens.count(ta[0][1]) == 300
    assert ta[1] != tb[1] and ta[1][0] == tb[1][0] == "user"
    assert [x.prompt_tokens for x in (a, b, b2, c)] == [400, 500, 600, 400]
    assert tb2[: len(tb)] == tb  # the session's own growth, from the shared context on
    assert [role for role, _ in tc] == ["user"]
    assert a.prefix_group == b.prefix_group == b2.prefix_group != c.prefix_group
