"""Agent sessions: causal plans, growing contexts, fan-out and rejoin, determinism, bounds."""

from __future__ import annotations

from typing import Any

import pytest

from lbtune import tokens
from lbtune.errors import ConfigError
from lbtune.scenario import (
    MAX_SESSION_CALLS,
    AgentWorkload,
    SessionPlan,
    SessionSource,
    build_workload,
    call_index,
    draws,
    load_scenario,
    scenario_from_dict,
    split,
)
from lbtune.scenario.limits import MAX_SUBAGENTS
from tests.scenario.conftest import base

AGENT: dict[str, Any] = {
    "calls": {"type": "uniform", "min": 3, "max": 8},
    "tool_delay_ms": {"type": "lognormal", "median": 800, "sigma": 0.8, "min": 20, "max": 20000},
    "tool_output_tokens": {
        "type": "lognormal",
        "median": 300,
        "sigma": 0.8,
        "min": 16,
        "max": 4096,
    },
    "prefix": {"groups": 4, "tokens": 512},
    "subagents": {
        "probability": 0.5,
        "count": {"type": "uniform", "min": 2, "max": 3},
        "calls": {"type": "uniform", "min": 1, "max": 3},
    },
}


def _workload(seed: int | None = None, **agent: Any) -> AgentWorkload:
    sc = scenario_from_dict(base(agent={**AGENT, **agent}, stream=0.5))
    w = build_workload(sc, seed=seed)
    assert isinstance(w, AgentWorkload)
    return w


def _same_agent_before(plan: SessionPlan, k: int) -> int | None:
    """The previous call of call ``k``'s agent, from the plan alone."""
    earlier = [p for p in range(k) if plan.calls[p].agent == plan.calls[k].agent]
    return earlier[-1] if earlier else None


def test_a_source_of_session_plans() -> None:
    w = _workload()
    assert isinstance(w, SessionSource)
    plan = w.session(3)
    assert plan.session == 3
    assert [c.index for c in plan.calls] == [call_index(3, k) for k in range(len(plan.calls))]
    assert split(plan.calls[-1].index) == (3, len(plan.calls) - 1)


def test_same_request_in_two_instances_and_seeds_differ() -> None:
    a, b, other = _workload(), _workload(), _workload(seed=99)
    for s in range(6):
        assert a.session(s) == b.session(s)
        for c in a.session(s).calls:
            assert a.request(c.index) == b[c.index]
    firsts = [a.request(call_index(s, 0)) for s in range(6)]
    assert firsts != [other.request(call_index(s, 0)) for s in range(6)]
    assert [a.session(s) for s in range(6)] != [other.session(s) for s in range(6)]


def test_plans_are_topological_and_causal() -> None:
    w = _workload()
    for s in range(40):
        plan = w.session(s)
        first = plan.calls[0]
        assert first.after == () and first.delay_s == 0.0 and first.agent == 0
        for k, c in enumerate(plan.calls):
            assert all(0 <= a < k for a in c.after), (s, k, c)
            if k > 0:
                assert c.after and 0.02 <= c.delay_s <= 20.0
        mains = [c for c in plan.calls if c.agent == 0]
        assert 3 <= len(mains) <= 8


def test_contexts_grow_by_answer_and_tool_output() -> None:
    w = _workload(subagents=None)
    out = w.agent.tool_output_tokens
    for s in range(20):
        plan = w.session(s)
        reqs = [w.request(c.index) for c in plan.calls]
        for k in range(1, len(reqs)):
            prev, now = reqs[k - 1], reqs[k]
            assert plan.calls[k].after == (k - 1,)
            assert now.messages is not None and prev.messages is not None
            assert now.messages[: len(prev.messages)] == prev.messages
            answer, tool = now.messages[len(prev.messages) :]
            assert answer["role"] == "assistant" and tool["role"] == "user"
            # call k-1's draws: (max_tokens, stream, tool output tokens)
            u = draws.uniforms(w.seed, draws.AGENT, s, 2, 0, k - 1, n=3)
            n_tool = out.sample(u[2])
            assert prev.max_tokens == w.mix.output_tokens.sample(u[0])
            assert tokens.count(answer["content"]) == prev.max_tokens
            assert tokens.count(tool["content"]) == n_tool
            assert now.prompt_tokens == prev.prompt_tokens + prev.max_tokens + n_tool
        assert {r.session_id for r in reqs} == {s}
        assert [r.turn for r in reqs] == list(range(len(reqs)))
        assert {r.traffic_class for r in reqs} == {"agent"}


def test_call_tokens_are_the_sum_of_the_drawn_parts() -> None:
    w = _workload()
    for s in range(20):
        plan = w.session(s)
        for k, c in enumerate(plan.calls):
            r = w.request(c.index)
            prev = _same_agent_before(plan, k)
            if prev is None:  # the shared context and the agent's task
                assert r.messages is not None and len(r.messages) == 2
                continue
            before = w.request(plan.calls[prev].index)
            assert r.messages is not None and before.messages is not None
            assert r.messages[: len(before.messages)] == before.messages
            added = r.messages[len(before.messages) :]
            joined = [a for a in c.after if plan.calls[a].agent != c.agent]
            assert len(added) == 2 + len(joined)  # answer, tool output, each subagent's answer
            n_added = r.prompt_tokens - before.prompt_tokens
            assert n_added >= before.max_tokens + sum(
                w.request(plan.calls[j].index).max_tokens for j in joined
            )


def test_subagents_share_the_prefix_and_rejoin() -> None:
    w = _workload(subagents={**AGENT["subagents"], "probability": 1.0})
    seen = 0
    for s in range(10):
        plan = w.session(s)
        reqs = [w.request(c.index) for c in plan.calls]
        system = {r.messages[0]["content"] for r in reqs if r.messages}
        assert len(system) == 1 and len({r.prefix_group for r in reqs}) == 1
        for k, c in enumerate(plan.calls):
            if c.agent == 0 or _same_agent_before(plan, k) is not None:
                continue
            seen += 1
            parent = c.after[0]
            assert plan.calls[parent].agent == 0 and reqs[k].traffic_class == "subagent"
            last = max(p for p, d in enumerate(plan.calls) if d.agent == c.agent)
            rejoin = next(m for m in range(parent + 1, len(plan.calls)) if plan.calls[m].agent == 0)
            assert last in plan.calls[rejoin].after
            prev_main = _same_agent_before(plan, rejoin)
            assert prev_main is not None
            before, after = reqs[prev_main].messages, reqs[rejoin].messages
            assert before is not None and after is not None
            added = after[len(before) :]
            joined = list(plan.calls[rejoin].after)
            assert [m["role"] for m in added] == ["assistant", "user"] + ["user"] * len(joined)
            answer = added[2 + joined.index(last)]["content"]  # the subagent's last answer
            assert tokens.count(answer) == reqs[last].max_tokens
    assert seen > 10


def test_a_call_beyond_the_plan_is_an_index_error() -> None:
    w = _workload()
    plan = w.session(5)
    with pytest.raises(IndexError, match=r"session 5 has \d+ calls"):
        w.request(call_index(5, len(plan.calls)))
    with pytest.raises(IndexError):
        w.request(-1)
    with pytest.raises(IndexError):
        call_index(0, MAX_SESSION_CALLS)


def test_streaming_fraction_and_body() -> None:
    w = _workload()
    reqs = [w.request(c.index) for s in range(30) for c in w.session(s).calls]
    share = sum(r.stream for r in reqs) / len(reqs)
    assert 0.3 < share < 0.7
    assert all(r.extra_body == {"ignore_eos": True} for r in reqs)
    assert {r.model for r in reqs} == {"m"}


def test_completions_prompt_is_the_joined_parts() -> None:
    w = AgentWorkload(scenario_from_dict(base(agent=AGENT, api="completions")))
    plan = w.session(0)
    k = next(k for k, c in enumerate(plan.calls) if _same_agent_before(plan, k) is not None)
    r = w.request(plan.calls[k].index)  # context, task, answer, tool output (and more)
    assert r.messages is None and r.prompt is not None and r.prompt.count("\n\n") >= 3
    assert tokens.count(r.prompt) == r.prompt_tokens


@pytest.mark.parametrize(
    ("over", "expected"),
    [
        ({"sessions": {"fraction": 0.5, "turns": 2}}, r"^x\.yaml: agent: cannot be combined "),
        (
            {"classes": [{"name": "a", "weight": 1}]},
            r"^x\.yaml: agent: cannot be combined with classes",
        ),
        (
            {"prefix": {"groups": 1, "tokens": 8, "fraction": 1}},
            r"^x\.yaml: agent: cannot be combined with prefix \(set agent\.prefix",
        ),
        (
            {"agent": {**AGENT, "calls": {"type": "fixed", "value": 1000}}},
            r"^x\.yaml: agent: calls: a session may hold \d+ calls .* more than the 4096",
        ),
        (
            {
                "agent": {
                    **AGENT,
                    "subagents": {**AGENT["subagents"], "count": {"type": "fixed", "value": 17}},
                }
            },
            rf"agent\.subagents: count: reaches 17 subagents, more than the {MAX_SUBAGENTS}",
        ),
        (
            {"agent": {**AGENT, "tool_output_tokens": {"type": "fixed", "value": 1_000_000}}},
            r"^x\.yaml: agent: a call may carry .* prompt tokens",
        ),
    ],
)
def test_bad_agent_scenarios_are_one_line(over: dict[str, Any], expected: str) -> None:
    data = base(agent=AGENT)
    data.update(over)
    with pytest.raises(ConfigError, match=expected) as err:
        scenario_from_dict(data, source="x.yaml")
    assert "\n" not in str(err.value)


def test_cached_sessions_count_into_the_memory_bound() -> None:
    big = {**AGENT, "prefix": {"groups": 1000, "tokens": 500_000}}
    with pytest.raises(ConfigError, match=r"agent: the generator would keep about"):
        scenario_from_dict(base(agent=big), source="x.yaml")


def test_builtin_agent_loads_and_runs_sessions() -> None:
    sc = load_scenario("agent")
    assert sc.agent is not None and sc.mode == "closed"
    w = build_workload(sc)
    assert isinstance(w, AgentWorkload)
    plans = [w.session(s) for s in range(50)]
    assert any(c.agent > 0 for p in plans for c in p.calls)
    longest = max(w.request(c.index).prompt_tokens for p in plans for c in p.calls)
    assert 6144 < longest < 64_000
