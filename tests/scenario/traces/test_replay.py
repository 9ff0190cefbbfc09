"""Trace replay: rows, exact token counts, shared prefixes, timing, windows, determinism."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from lbtune import tokens
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions
from lbtune.scenario import build_workload, load_scenario, plan_load, scenario_from_dict
from lbtune.scenario.loader import trace_ref
from lbtune.scenario.runplan import read_run_plan, write_run_plan
from lbtune.scenario.traces.read import read_trace
from tests.scenario.traces.conftest import burstgpt_text


def _text(spec: object) -> str:
    msgs = getattr(spec, "messages", None) or ()
    return "\n\n".join(m["content"] for m in msgs)


@pytest.mark.parametrize(
    ("fmt", "rows"), [("azure", 20), ("burstgpt", 12), ("mooncake", 10), ("sharegpt", 9)]
)
def test_every_format_reads_every_row(traces: dict[str, Path], fmt: str, rows: int) -> None:
    assert len(read_trace(traces[fmt], fmt)) == rows
    sc = load_scenario(trace_ref(traces[fmt], fmt))
    assert sc.source is not None and sc.source.format == fmt and sc.source.sha256


@pytest.mark.parametrize("fmt", ["azure", "burstgpt", "mooncake"])
def test_prompts_have_the_traces_exact_token_counts_and_max_tokens(
    traces: dict[str, Path], fmt: str
) -> None:
    rows = read_trace(traces[fmt], fmt)
    w = build_workload(load_scenario(trace_ref(traces[fmt], fmt)))
    for i, row in enumerate(rows):
        spec = w.request(i)
        assert spec.prompt_tokens == row.prompt_tokens == tokens.count(_text(spec))
        assert spec.max_tokens == row.output_tokens
        assert spec.body()["ignore_eos"] is True


def test_burstgpt_keeps_served_models_and_a_failed_row_asks_for_one_token(
    traces: dict[str, Path],
) -> None:
    sc = scenario_from_dict(
        {
            "source": {"trace": str(traces["burstgpt"]), "format": "burstgpt"},
            "models": {"llama-3.1-8b-instruct": 1, "other": 1},
        }
    )
    w = build_workload(sc)
    assert w.request(0).model == "llama-3.1-8b-instruct"  # in the trace, and served
    assert {w.request(i).model for i in range(12)} <= {"llama-3.1-8b-instruct", "other"}
    assert w.request(4).max_tokens == 1


def test_send_times_are_the_traces_scaled_by_speedup(traces: dict[str, Path]) -> None:
    for speed in (1.0, 4.0):
        plan = plan_load(load_scenario(trace_ref(traces["azure"], "azure", speed)))
        assert plan.mode == "open" and len(plan.arrivals) == 20
        for i, t in enumerate(plan.arrivals):
            assert t == pytest.approx(i * 0.25 / speed, abs=1e-5)
        assert plan.duration_s > plan.arrivals[-1]


def test_a_window_starts_late_and_stops_at_a_limit(traces: dict[str, Path]) -> None:
    ref = trace_ref(traces["azure"], "azure", 2.0, start=1.0, limit=5)
    sc = load_scenario(ref)
    plan = plan_load(sc)
    assert len(plan.arrivals) == 5 and plan.arrivals[0] == pytest.approx(0.0, abs=1e-5)
    assert plan.arrivals[1] == pytest.approx(0.125, abs=1e-5)
    first = build_workload(sc).request(0)
    assert first.prompt_tokens == 40 + 7 * 4  # row 4 is at 1.0 s
    assert "from 1 s, 5 requests" in sc.name and "x2 speed" in sc.name
    # A shorter test keeps the trace's first seconds.
    assert len(plan_load(sc, duration_s=0.3).arrivals) == 3


def test_rate_scale_thins_the_same_rows_for_the_same_seed(tmp_path: Path) -> None:
    from tests.scenario.traces.conftest import azure_text

    p = tmp_path / "big.csv"
    p.write_text(azure_text(2000, gap=0.01))
    a = plan_load(load_scenario(trace_ref(p, "azure", rate_scale=0.25)))
    b = plan_load(load_scenario(trace_ref(p, "azure", rate_scale=0.25)))
    assert a.arrivals == b.arrivals
    assert 400 < len(a.arrivals) < 600


def test_the_same_trace_and_seed_give_the_same_requests(traces: dict[str, Path]) -> None:
    sc = load_scenario(trace_ref(traces["azure"], "azure"))
    one, two = build_workload(sc), build_workload(sc)
    assert [one.request(i) for i in range(20)] == [two.request(i) for i in range(20)]
    other = build_workload(sc, seed=sc.seed + 1)
    assert _text(other.request(0)) != _text(one.request(0))
    assert other.request(0).prompt_tokens == one.request(0).prompt_tokens


def test_mooncake_shared_blocks_become_exactly_the_shared_prefix(traces: dict[str, Path]) -> None:
    w = build_workload(load_scenario(trace_ref(traces["mooncake"], "mooncake")))
    texts = [tokens.split(_text(w.request(i))) for i in range(10)]
    for a, b in itertools.pairwise(texts):
        common = 0
        while common < min(len(a), len(b)) and a[common] == b[common]:
            common += 1
        assert 1024 <= common < 1024 + 8  # two 512-token blocks (a word may repeat by chance)
    assert {w.request(i).prefix_group for i in range(10)} == {0}


def test_sharegpt_replays_real_texts_as_sessions(traces: dict[str, Path]) -> None:
    sc = scenario_from_dict(
        {
            "source": {"trace": str(traces["sharegpt"]), "format": "sharegpt"},
            "load": {"type": "rate", "rate": 5},
            "duration_s": 4,
            "turn_gap": 2,
        }
    )
    w = build_workload(sc)
    specs = [w.request(i) for i in range(9)]
    firsts = [s for s in specs if s.turn == 0]
    seconds = [s for s in specs if s.turn == 1]
    assert len(firsts) == 6 and len(seconds) == 3
    follow = seconds[0]
    assert follow.messages is not None and len(follow.messages) == 3
    assert follow.messages[0]["content"].startswith("Question")
    assert follow.messages[1]["role"] == "assistant"
    assert follow.max_tokens == tokens.count("Send a session back to its replica.")
    # The scenario's load times an untimed trace.
    assert plan_load(sc).mode == "open" and len(plan_load(sc).arrivals) > 5


def test_a_run_replays_exactly_from_its_requests_parquet(tmp_path: Path) -> None:
    from lbtune.loadgen.recordio import write_parquet
    from lbtune.records.requests import RequestRecord

    run = tmp_path / "run"
    plan = plan_run(StressOptions(scenario="chat", duration_s=20, rate=2))
    write_run_plan(run, plan)
    recorded = build_workload(plan.scenario, plan.seed)
    arrivals = plan.load_plan().arrivals[:15]
    recs = [
        RequestRecord(
            request_id=f"r{i}",
            index=i,
            model="m",
            api="chat",
            stream=True,
            sent_at=1000 + t + 0.001,
            ended_at=1000 + t + 0.5,
            outcome="ok",
            scheduled_at=1000 + t,
            prompt_tokens=recorded.request(i).prompt_tokens,
            output_tokens=recorded.request(i).max_tokens,
        )
        for i, t in enumerate(arrivals)
    ]
    write_parquet(recs, run / "requests.parquet")
    sc = load_scenario(trace_ref(run / "requests.parquet", "lbtune"))
    replay = build_workload(sc)
    for i in range(15):
        got, want = replay.request(i), recorded.request(i)
        assert got.messages == want.messages and got.max_tokens == want.max_tokens
    times = plan_load(sc).arrivals
    assert times == pytest.approx([t - arrivals[0] for t in arrivals], abs=1e-6)
    # Without its run.json, the recorded lengths.
    (run / "run.json").unlink()
    bare = build_workload(load_scenario(trace_ref(run / "requests.parquet", "lbtune")))
    assert bare.request(3).prompt_tokens == recs[3].prompt_tokens
    assert bare.request(3).max_tokens == recs[3].output_tokens


def test_the_run_plan_pins_the_trace_and_workers_refuse_a_changed_file(tmp_path: Path) -> None:
    p = tmp_path / "b.csv"
    p.write_text(burstgpt_text(12))
    plan = plan_run(StressOptions(scenario=trace_ref(p, "burstgpt", 2.0)))
    assert plan.load.mode == "open" and plan.load.arrivals == 12
    assert plan.load.duration_s == pytest.approx(5.5 / 2 + 0.25, abs=1e-6)
    write_run_plan(tmp_path / "run", plan)
    back = read_run_plan(tmp_path / "run")
    assert back.load_plan().arrivals == plan_load(plan.scenario).arrivals
    p.write_text(burstgpt_text(13))
    from lbtune.errors import ConfigError

    with pytest.raises(ConfigError, match="changed since the run was planned"):
        build_workload(back.scenario, back.seed)


def test_a_scenario_file_names_its_trace_relative_to_itself(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "b.csv").write_text(burstgpt_text(12))
    (tmp_path / "s.yaml").write_text(
        json.dumps({"source": {"trace": "t/b.csv", "format": "burstgpt", "speedup": 3}})
    )
    sc = load_scenario(tmp_path / "s.yaml")
    assert sc.source is not None and Path(sc.source.trace) == (tmp_path / "t" / "b.csv").resolve()
    assert len(plan_load(sc).arrivals) == 12
