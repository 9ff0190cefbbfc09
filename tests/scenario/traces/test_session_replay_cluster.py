"""A WEKA agent trace replayed on the embedded mini2 cluster: every call is sent no earlier
than the calls it waits for ended plus its recorded delay / speedup, and the summary has
the session figures."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lbtune.scenario.loader import trace_ref
from lbtune.scenario.sessionplan import call_index, split
from tests.conftest import running_cluster

pytestmark = pytest.mark.integration

SESSIONS = 8
SPEEDUP = 2.0
TOLERANCE_S = 0.002
"""How early a send may read against its due time: the records' clocks round to µs."""


def _weka(path: Path) -> Path:
    """Sessions 1 s apart: main call 0 fans out to two subagents (2 calls and 1 call)
    that rejoin at main call 1; main call 2 follows; tool delays 0.3-0.7 s."""
    lines = []
    for s in range(SESSIONS):
        t0 = float(s)
        main0 = {"t": t0, "dur": 0.2, "in": 300, "out": 8, "type": "main"}
        subs = [
            {"t": t0 + 0.5, "dur": 0.2, "in": 200, "out": 6, "agent": "a", "parent": 0},
            {"t": t0 + 0.6, "dur": 0.2, "in": 220, "out": 6, "agent": "b", "parent": 0},
            {"t": t0 + 1.1, "dur": 0.2, "in": 240, "out": 6, "agent": "a"},
        ]
        main1 = {"t": t0 + 2.0, "dur": 0.2, "in": 420, "out": 8, "type": "main"}
        main2 = {"t": t0 + 2.8, "dur": 0.2, "in": 500, "out": 8, "type": "main"}
        reqs = [main0, *({**x, "type": "subagent"} for x in subs), main1, main2]
        lines.append(json.dumps({"session_id": f"s{s}", "t": t0, "requests": reqs}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_cluster(tmp_path_factory.mktemp("session-cluster"), time_scale=8.0) as ep:
        yield ep


def test_calls_wait_for_their_causes_and_the_summary_has_sessions(
    cluster: Any, tmp_path: Path
) -> None:
    from lbtune.loadgen.recordio import read_records
    from lbtune.run.stress import StressOptions, run_stress
    from lbtune.scenario.traces.sessions import TraceSessionWorkload
    from lbtune.scenario.workload import build_workload

    result = run_stress(
        StressOptions(
            scenario=trace_ref(_weka(tmp_path / "agents.jsonl"), "weka", SPEEDUP),
            duration_s=12,
            state_dir=Path(cluster.state_dir),
            out_dir=tmp_path / "run",
            write_report=False,
        )
    )
    records = read_records(result.records_path)
    assert records and all(r.outcome == "ok" for r in records), {r.outcome for r in records}
    workload = build_workload(result.plan.scenario, result.plan.seed, result.plan.tokenizer)
    assert isinstance(workload, TraceSessionWorkload)
    by_index = {r.index: r for r in records}
    waited = 0
    for r in records:
        s, k = split(r.index)
        call = workload.session(s).calls[k]
        if not call.after:
            continue
        causes = [by_index[call_index(s, a)] for a in call.after]  # sent, so they ended
        due = max(c.ended_at for c in causes) + call.delay_s
        assert r.sent_at >= due - TOLERANCE_S, (s, k, r.sent_at - due)
        waited += 1
    assert waited >= SESSIONS * 3  # most sessions ran to their end
    plan = workload.session(0)
    assert [c.after for c in plan.calls] == [(), (0,), (0,), (1,), (0, 2, 3), (4,)]
    assert plan.calls[3].delay_s == pytest.approx(0.4 / SPEEDUP)  # 1.1 - (0.5 + 0.2)
    assert plan.calls[4].delay_s == pytest.approx(0.7 / SPEEDUP)  # 2.0 - (1.1 + 0.2)
    assert {r.session_id for r in records} == set(range(SESSIONS))
    sessions = result.summary.sessions
    assert sessions is not None and sessions.failed == 0, sessions
    assert sessions.started == SESSIONS and sessions.completed >= SESSIONS - 1, sessions
