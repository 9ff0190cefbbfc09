"""The three agentic formats replay and fit alike (issue 28's done-when): the same sessions,
written by each format's writer (:mod:`tests.scenario.traces.agentic_files`), detected from
the file, give the same session plans (parents, tool delays over ``speedup``), requests of
the recorded lengths, and a fitted ``agent:`` scenario that validates."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.scenario import build_workload, load_scenario, scenario_from_dict
from lbtune.scenario.loader import trace_ref
from lbtune.scenario.sessionplan import SessionSource, call_index
from lbtune.scenario.traces.fitsessions import fit_sessions
from lbtune.scenario.traces.read import guess_format
from tests.scenario.traces.agentic_files import Session, write

FORMATS = {"weka": "agents.jsonl", "otel": "spans.json", "copilot": "sessions.json"}


def _sessions(n: int) -> list[Session]:
    """``n`` chains of three calls, 0.5 s apart: call k ends 1 s after it starts, and the next
    starts after a tool run of 0.2 s (call 1) or 0.4 s (call 2); each prompt resends the
    last one, its answer and some tool output."""
    out: list[Session] = []
    for s in range(n):
        t0 = 0.5 * s
        out.append(
            {
                "start": t0,
                "calls": [
                    {"start": t0, "end": t0 + 1.0, "in": 400, "out": 30},
                    {"start": t0 + 1.2, "end": t0 + 2.2, "in": 500, "out": 30},
                    {"start": t0 + 2.6, "end": t0 + 3.6, "in": 650, "out": 30},
                ],
            }
        )
    return out


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_each_format_replays_as_the_same_causal_sessions(tmp_path: Path, fmt: str) -> None:
    path = write(fmt, tmp_path / FORMATS[fmt], _sessions(6))
    assert guess_format(path) == fmt
    sc = load_scenario(trace_ref(path))
    assert sc.source is not None and sc.source.format == fmt
    sc = sc.model_copy(update={"source": sc.source.model_copy(update={"speedup": 2.0})})
    w = build_workload(sc)
    assert isinstance(w, SessionSource)
    for s in (0, 5, 6):  # session 6 is kept session 0 again (a closed loop asks for more)
        plan = w.session(s)
        assert [c.after for c in plan.calls] == [(), (0,), (1,)]
        assert [c.delay_s for c in plan.calls] == pytest.approx([0.0, 0.1, 0.2])
        assert [c.index for c in plan.calls] == [call_index(s, k) for k in range(3)]
    specs = [w.request(call_index(1, k)) for k in range(3)]
    assert [r.prompt_tokens for r in specs] == [400, 500, 650]
    assert [r.max_tokens for r in specs] == [30, 30, 30]
    assert all(r.session_id == 1 and r.traffic_class == "trace" for r in specs)


def test_each_format_fits_the_same_agent_scenario(tmp_path: Path) -> None:
    """Every call after the first waited 0.2 or 0.4 s and its prompt grew by 70 or 120
    tokens of tool output (500 - 400 - 30, 650 - 500 - 30); sessions start 0.5 s apart."""
    docs = {}
    for fmt, name in FORMATS.items():
        doc = fit_sessions(write(fmt, tmp_path / name, _sessions(40)), fmt)
        sc = scenario_from_dict(doc)
        assert sc.agent is not None and sc.agent.max_calls() == 3
        delays, growth = doc["agent"]["tool_delay_ms"], doc["agent"]["tool_output_tokens"]
        assert (delays["min"], delays["max"]) == (200, 400)
        assert (growth["min"], growth["max"]) == (70, 120)
        assert doc["prompt_tokens"] == {"type": "fixed", "value": 400}
        assert doc["output_tokens"] == {"type": "fixed", "value": 30}
        assert doc["load"]["rate"] == pytest.approx(2.0)
        docs[fmt] = {k: doc[k] for k in ("agent", "prompt_tokens", "output_tokens", "load")}
    assert docs["otel"] == docs["weka"] == docs["copilot"]
