"""summarize_run's session figures: the planned calls of the sessions a run's records hold,
only for an agent-session workload."""

from __future__ import annotations

from dataclasses import replace

from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions
from lbtune.run.summary import session_calls
from lbtune.scenario.sessionplan import SessionSource, call_index
from lbtune.scenario.workload import build_workload
from tests.metrics.records import rec


def test_a_workload_without_agent_sessions_has_none() -> None:
    plan = plan_run(StressOptions(scenario="chat", duration_s=5, seed=3))
    chat_turn = replace(rec(5, sent=1.0), session_id=2)  # a chat session is not an agent's
    assert session_calls(plan, [chat_turn]) is None


def test_the_planned_calls_of_the_sessions_seen_only() -> None:
    plan = plan_run(StressOptions(scenario="agent", duration_s=5, seed=3))
    records = [
        replace(rec(call_index(s, k), sent=1.0), session_id=s) for s in (0, 4) for k in (0, 1)
    ]
    records.append(rec(9, sent=1.0))  # no session: ignored
    workload = build_workload(plan.scenario, plan.seed, plan.tokenizer)
    assert isinstance(workload, SessionSource)
    got = session_calls(plan, records)
    assert got == {s: len(workload.session(s).calls) for s in (0, 4)}
    assert got is not None and all(n >= 3 for n in got.values())  # agent.yaml: 3-8 calls
