"""The twin's event loop: determinism, the live generator's sending rules, the run's end,
and bad input."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest

from lbtune.errors import ConfigError
from lbtune.metrics.censor import occupies
from lbtune.records.requests import RequestRecord
from lbtune.scenario.workload import build_workload
from lbtune.targets.haproxy.twin import routing_model
from lbtune.twin.options import TwinOptions
from lbtune.twin.replica import TwinReplica
from lbtune.twin.requests import RequestSource
from lbtune.twin.routing import ClusterView, Decision, RequestView, RoutingModel, Send
from lbtune.twin.run import Reuse, simulate
from tests.twin.helpers import M8, M70, cluster_replicas, plan, scenario_file


class Always(RoutingModel):
    """Every request to one replica (and a log of what was routed when)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.routed: list[tuple[float, int]] = []
        self.ended: list[tuple[float, int]] = []

    def route(self, req: RequestView, now: float, cluster: ClusterView) -> Decision:
        self.routed.append((now, req.index))
        return Send(self.name)

    def on_end(
        self, req: RequestView, replica: str, now: float
    ) -> Sequence[tuple[RequestView, str]]:
        self.ended.append((now, req.index))
        return ()


ONE = [TwinReplica("h100-0", "h100-80g", (M8, M70))]


def _intervals_max_overlap(recs: Sequence[RequestRecord]) -> int:
    edges = sorted([(r.sent_at, 1) for r in recs] + [(r.ended_at, -1) for r in recs])
    best = cur = 0
    for _, d in edges:
        cur += d
        best = max(best, cur)
    return best


def test_same_seed_same_config_gives_identical_records() -> None:
    reps = cluster_replicas("hetero4")
    p = plan("mixed", duration_s=20)
    for params in ({"algorithm": "roundrobin"}, {"algorithm": "random"}, {"algorithm": "llm"}):
        a = simulate(p, reps, routing_model(params, reps, seed=3), TwinOptions(time_scale=4))
        b = simulate(p, reps, routing_model(params, reps, seed=3), TwinOptions(time_scale=4))
        assert a.records == b.records, params
        assert len(a.records) > 20


def test_a_shared_request_source_changes_nothing() -> None:
    reps = cluster_replicas("mini2")
    p = plan("chat", duration_s=10)
    src = RequestSource(p)
    opts = TwinOptions(time_scale=4)
    first = simulate(p, reps, routing_model({}, reps), opts, Reuse(src))
    again = simulate(p, reps, routing_model({}, reps), opts, Reuse(src))
    fresh = simulate(p, reps, routing_model({}, reps), opts)
    assert first.records == again.records == fresh.records


def test_closed_loop_users_send_one_request_at_a_time_in_index_order(tmp_path: Path) -> None:
    sc = scenario_file(tmp_path, load={"type": "constant", "users": 3})
    p = plan(sc)
    model = Always("h100-0")
    run = simulate(p, ONE, model, TwinOptions(time_scale=2))
    recs = sorted(run.records, key=lambda r: r.sent_at)
    assert [r.index for r in recs] == list(range(len(recs)))  # one counter, in send order
    assert _intervals_max_overlap(recs) <= 3
    # After the three first sends, every send is some earlier request's end (its user's).
    ends = sorted(r.ended_at for r in recs)
    for r in recs[3:]:
        assert any(abs(e - r.sent_at) < 1e-12 for e in ends), r.index
    # The requests are the scenario's, request i = f(seed, i).
    wl = build_workload(p.scenario, p.seed)
    for r in recs[:5]:
        assert r.prompt_tokens is not None and r.model == wl.request(r.index).model
    # Locust starts the three users in one batch (a greenlet start apart).
    assert [round(r.sent_at, 9) for r in recs[:3]] == [0.0, 0.00025, 0.0005]


def test_one_user_sends_back_to_back(tmp_path: Path) -> None:
    p = plan(scenario_file(tmp_path, load={"type": "constant", "users": 1}))
    run = simulate(p, ONE, Always("h100-0"), TwinOptions(time_scale=2))
    recs = sorted(run.records, key=lambda r: r.sent_at)
    for prev, nxt in itertools.pairwise(recs):
        assert nxt.sent_at == prev.ended_at
    assert all(r.outcome == "ok" for r in recs[:-1])


def test_open_loop_send_times_are_the_plans(tmp_path: Path) -> None:
    sc = scenario_file(tmp_path, load={"type": "rate", "rate": 5.0})
    p = plan(sc)
    run = simulate(p, ONE, Always("h100-0"), TwinOptions(time_scale=2))
    arrivals = p.load_plan().arrivals
    assert len(run.records) == len(arrivals)
    for r in run.records:
        assert r.scheduled_at == r.sent_at == arrivals[r.index]


def test_streamed_records_have_one_chunk_per_token(tmp_path: Path) -> None:
    p = plan(scenario_file(tmp_path, duration_s=5, warmup_s=1, cooldown_s=1))
    run = simulate(p, ONE, Always("h100-0"), TwinOptions(time_scale=1))
    ok = [r for r in run.records if r.outcome == "ok"]
    assert ok
    for r in ok:
        assert r.output_tokens == 32 and len(r.chunk_times) == 32
        assert r.first_token_at == r.chunk_times[0] and r.ended_at == r.chunk_times[-1]
        assert r.replica == "h100-0" and r.status_code == 200
        assert r.ttft is not None and 0 < r.ttft < r.e2e
    # The replica's TTFT includes the GPU profile's 7 ms request overhead.
    assert min(r.ttft for r in ok if r.ttft is not None) > 0.007


def test_the_time_scale_divides_every_latency(tmp_path: Path) -> None:
    sc = scenario_file(tmp_path, load={"type": "constant", "users": 1})
    p = plan(sc, duration_s=20)
    slow = simulate(p, ONE, Always("h100-0"), TwinOptions(1, to_replica_s=0, to_client_s=0))
    fast = simulate(p, ONE, Always("h100-0"), TwinOptions(4, to_replica_s=0, to_client_s=0))
    assert fast.records[0].e2e == pytest.approx(slow.records[0].e2e / 4)
    assert len(fast.records) > 3 * len(slow.records)


def test_the_run_ends_like_the_live_drain(tmp_path: Path) -> None:
    # 400-token answers at time scale 0.05: a request takes ~60 s, the run 20 s + 5 s grace.
    sc = scenario_file(tmp_path, output_tokens={"type": "fixed", "value": 400})
    p = plan(sc)
    run = simulate(p, ONE, Always("h100-0"), TwinOptions(time_scale=0.05))
    assert run.ended_at == pytest.approx(p.load.duration_s + 5.0)
    assert {r.outcome for r in run.records} == {"cancelled"}
    for r in run.records:
        assert r.ended_at == pytest.approx(25.0) and r.error == "cut off when the test stopped"
        assert 0 < len(r.chunk_times) == (r.output_tokens or 0) < 400


def test_the_client_timeout(tmp_path: Path) -> None:
    sc = scenario_file(tmp_path, output_tokens={"type": "fixed", "value": 400})
    p = plan(sc)
    model = Always("h100-0")
    run = simulate(p, ONE, model, TwinOptions(time_scale=0.05, request_timeout_s=4.0))
    timed_out = [r for r in run.records if r.outcome == "timeout"]
    assert timed_out
    for r in timed_out:
        assert r.ended_at == pytest.approx(r.sent_at + 4.0)
    # The balancer hears of the end (its slot is freed) at the timeout.
    ends = dict((i, t) for t, i in model.ended)
    assert ends[timed_out[0].index] == pytest.approx(timed_out[0].ended_at)


def test_the_window_and_figures_are_the_live_ones(tmp_path: Path) -> None:
    p = plan(scenario_file(tmp_path))
    run = simulate(p, ONE, Always("h100-0"), TwinOptions(time_scale=2))
    assert (run.window.start, run.window.end) == p.window_at(0.0)
    s = run.summary()
    inside = [r for r in run.records if run.window.contains(r.sent_at) and r.outcome == "ok"]
    assert s.latency.e2e.count == len(inside)
    assert "virtual-time twin" in " ".join(s.notes)
    cs = run.censored()
    # The live rule (issue 22): every request that occupies the window, those sent in the
    # warm-up and still running when it opened included.
    w = run.window
    occupying = [r for r in run.records if occupies(r.sent_at, r.ended_at, w.start, w.end)]
    carried = [r for r in occupying if r.sent_at < w.start]
    assert (
        cs.sent
        == len(occupying)
        == len([r for r in run.records if w.contains(r.sent_at)]) + len(carried)
    )
    assert cs.carried == len(carried)


def test_a_model_no_replica_serves_is_a_config_error(tmp_path: Path) -> None:
    p = plan(scenario_file(tmp_path, models={M70: 1}))
    l4 = [TwinReplica("l4-0", "l4-24g", (M8,))]
    with pytest.raises(ConfigError, match=r"uses llama-3.1-70b-instruct-awq, which no replica"):
        simulate(p, l4, Always("l4-0"))


def test_unknown_profiles_and_picks_are_config_errors(tmp_path: Path) -> None:
    p = plan(scenario_file(tmp_path))
    with pytest.raises(ConfigError, match="Unknown GPU profile 'h200'"):
        simulate(p, [TwinReplica("x", "h200", (M8,))], Always("x"))
    with pytest.raises(ConfigError, match="picked unknown replica 'nope'"):
        simulate(p, ONE, Always("nope"))
    with pytest.raises(ConfigError, match="no replica"):
        simulate(p, [], Always("x"))
    with pytest.raises(ConfigError, match="time_scale must be > 0"):
        TwinOptions(time_scale=0)


def test_an_unmodeled_knob_is_reported(tmp_path: Path) -> None:
    p = plan(scenario_file(tmp_path, duration_s=5, warmup_s=1, cooldown_s=1))
    reps = cluster_replicas("mini2")
    model = routing_model({"algorithm": "leastconn", "agent.a": 0.7, "bogus": 1}, reps)
    run = simulate(p, reps, model)
    assert run.unmodeled == ("agent.a", "bogus")
    assert any("not modeled by the twin: agent.a, bogus" in n for n in run.summary().notes)
