"""`lbtune scenarios fit` of an agentic trace: an ``agent:`` scenario that validates and
recovers the parameters a synthetic trace was written with."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from lbtune.cli import app
from lbtune.records.quantiles import percentile
from lbtune.scenario import load_scenario, plan_load, scenario_from_dict
from lbtune.scenario.traces import fitsessions
from lbtune.scenario.traces.fitsessions import fit_sessions
from lbtune.scenario.traces.sessiongraph import TraceCall, TraceSession

TOOL = 300
"""Tokens every call's context grows by, besides the previous answer."""


def _weka(path: Path, n: int, *, seed: int = 5, fan_out: int = 0) -> Path:
    """``n`` sessions of 4 main calls, Poisson starts at 2/s, lognormal tool delays (median
    700 ms), contexts growing by the answer plus :data:`TOOL` tokens; sessions ``s`` with
    ``s % fan_out == 0`` (when set) fan out after their first call to 2 subagents of 3
    calls. First calls begin with one of two 2-block shared contexts."""
    rng = random.Random(seed)
    start = 0.0
    lines = []
    for s in range(n):
        start += rng.expovariate(2.0)
        t, prompt = start, 1024 + 200 + s % 50
        reqs: list[dict[str, Any]] = []
        for k in range(4):
            out = 20 + (s + k) % 30
            ids = [s % 2 * 10, s % 2 * 10 + 1, 1000 + 10 * s + k]
            reqs.append({"t": t, "dur": 0.3, "in": prompt, "out": out, "hash_ids": ids})
            t += 0.3 + rng.lognormvariate(math.log(0.7), 0.5)
            if k == 0 and fan_out and s % fan_out == 0:
                for a in ("x", "y"):
                    for c in range(3):
                        sub = {
                            "t": t,
                            "dur": 0.1,
                            "in": 400 + (10 + TOOL) * c,
                            "out": 10,
                            "agent": a,
                        }
                        reqs.append({**sub, "type": "subagent", "parent": 0})
                        t += 0.1 + 0.2
                prompt += 20  # the two subagents' last answers rejoin
            prompt += out + TOOL
        lines.append(json.dumps({"session_id": f"s{s}", "t": start, "requests": reqs}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _median(dist: dict[str, Any]) -> float:
    if dist["type"] == "fixed":
        return float(dist["value"])
    if dist["type"] == "lognormal":
        return float(dist["median"])
    return float(dist["percentiles"][50])


def test_the_fit_recovers_the_traces_parameters(tmp_path: Path) -> None:
    doc = fit_sessions(_weka(tmp_path / "a.jsonl", 200), "weka")
    sc = scenario_from_dict(doc)  # validates as an agent scenario
    agent = sc.agent
    assert agent is not None and sc.fitted is not None
    assert doc["agent"]["calls"] == {"type": "fixed", "value": 4}
    delay = _median(doc["agent"]["tool_delay_ms"])
    assert abs(delay - 700) / 700 < 0.15, doc["agent"]["tool_delay_ms"]
    assert doc["agent"]["tool_output_tokens"] == {"type": "fixed", "value": TOOL}
    assert doc["agent"]["prefix"] == {"groups": 2, "tokens": 1024}
    assert 200 <= _median(doc["prompt_tokens"]) <= 250  # the first prompt less the 1024 shared
    assert "subagents" not in doc["agent"]
    assert doc["load"]["type"] == "rate" and abs(doc["load"]["rate"] - 2.0) < 0.4
    assert plan_load(sc).arrival == "poisson"
    assert sc.fitted.requests == 800 and sc.fitted.format == "weka"
    assert set(sc.fitted.percentiles) >= {"calls", "tool_delay_ms", "prompt_tokens", "gap_s"}


def test_fan_outs_fit_subagents(tmp_path: Path) -> None:
    doc = fit_sessions(_weka(tmp_path / "a.jsonl", 200, fan_out=4), "weka")
    sub = doc["agent"]["subagents"]
    # 50 of the 200 sessions fan out after the first of their 3 eligible main calls.
    assert sub["probability"] == pytest.approx(50 / 600, abs=1e-3)
    assert sub["count"] == {"type": "fixed", "value": 2}
    assert sub["calls"] == {"type": "fixed", "value": 3}
    assert doc["agent"]["tool_output_tokens"] == {"type": "fixed", "value": TOOL}  # rejoin excluded
    scenario_from_dict(doc)


def test_cached_tokens_give_the_shared_context(monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = tuple(
        TraceSession(
            line=s + 1,
            start_s=float(s),
            calls=(
                TraceCall(s + 1, 3000 + s, 50, (), 0.0, cached_tokens=0 if s < 2 else 2048 + s % 2),
                TraceCall(s + 1, 3000 + s + 50 + 100, 50, (0,), 1.0),
            ),
        )
        for s in range(40)
    )
    monkeypatch.setattr(fitsessions, "read_sessions", lambda path, fmt: sessions)
    doc = fit_sessions("x.jsonl", "otel")
    assert doc["agent"]["prefix"] == {"groups": 2, "tokens": 2048}
    assert doc["agent"]["calls"] == {"type": "fixed", "value": 2}
    assert doc["agent"]["tool_output_tokens"] == {"type": "fixed", "value": 100}
    assert doc["agent"]["tool_delay_ms"] == {"type": "fixed", "value": 1000}
    scenario_from_dict(doc)


def test_long_growing_sessions_are_capped_to_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    def session(s: int) -> TraceSession:
        calls = [
            TraceCall(s + 1, 1000 + 30_000 * k, 500, (k - 1,) if k else (), 1.0) for k in range(300)
        ]
        return TraceSession(line=s + 1, start_s=float(s), calls=tuple(calls))

    sessions = tuple(session(s) for s in range(5))
    monkeypatch.setattr(fitsessions, "read_sessions", lambda path, fmt: sessions)
    doc = fit_sessions("x.jsonl", "weka")
    sc = scenario_from_dict(doc)
    assert sc.agent is not None and 1 <= sc.agent.max_calls() < 300
    assert "max lowered to" in doc["fitted"]["fit"]["calls"]


def test_fit_then_show_on_the_cli(tmp_path: Path) -> None:
    trace = _weka(tmp_path / "agents.jsonl", 60, fan_out=3)
    out = tmp_path / "fitted.yaml"
    runner = CliRunner()
    res = runner.invoke(app, ["scenarios", "fit", str(trace), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "tool_delay_ms:" in res.output and "subagents:" in res.output
    sc = load_scenario(out)
    assert sc.agent is not None and yaml.safe_load(out.read_text())["fitted"]["format"] == "weka"
    shown = runner.invoke(app, ["scenarios", "show", str(out), "--json"])
    assert shown.exit_code == 0, shown.output
    preview = json.loads(shown.output)["preview"]
    assert "trace" in preview["prompt_tokens"]["p50"] and preview["arrival"]
    assert preview["agent"]["sessions"] >= 1
    gaps = [float(v["trace"]) for v in preview["arrival"].values()]
    assert gaps == sorted(gaps) and percentile(gaps, 0) >= 0
