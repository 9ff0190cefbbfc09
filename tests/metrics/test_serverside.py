"""collect() and the summary's JSON round trip, with a scripted querier (no Prometheus)."""

from __future__ import annotations

import json

import pytest

from lbtune.errors import ConfigError, TargetError
from lbtune.metrics import promql
from lbtune.metrics.prom import PrometheusUnreachable, Sample
from lbtune.metrics.promql import BalancerSeries
from lbtune.metrics.serverside import NEWEST_SAMPLE, collect
from lbtune.metrics.stats import summarize
from lbtune.metrics.summary import BalancerSide, GeneratorHealth, RunSummary, Window
from lbtune.metrics.summary_file import dumps, summary_from_data
from lbtune.records.slo import Slo
from tests.metrics.records import rec

T0 = 4_000_000.0
WINDOW = Window(T0, T0 + 30)
LB = BalancerSeries(
    "lb",
    queue="lb_queue",
    pool_label="proxy",
    sessions="lb_sessions",
    responses="lb_responses_total",
    server_names={"http://127.0.0.1:9001": "r1"},
)
"""A balancer's series as its registry entry would name them (metrics knows none)."""


class Scripted:
    """Answers each query by its key; dies (unreachable) after ``die_after`` queries."""

    def __init__(self, answers: dict[str, list[Sample]], die_after: int | None = None) -> None:
        queries = promql.server_side_queries(30, balancer=LB)
        self.by_query = {q: answers.get(k, []) for k, q in queries.items()}
        self.die_after = die_after
        self.calls: list[tuple[str, float | None]] = []

    def query(self, q: str, at: float | None = None) -> list[Sample]:
        if self.die_after is not None and len(self.calls) >= self.die_after:
            raise PrometheusUnreachable("Prometheus at http://x is unreachable (ConnectionError)")
        self.calls.append((q, at))
        if "preemptions" in q:
            raise TargetError(f"Prometheus query failed (400): {q}")
        return self.by_query.get(q, [])  # a query it was not scripted for: no series


def s(value: float | None, **labels: str) -> Sample:
    return Sample(labels=labels, value=value)


ANSWERS = {
    "running_avg": [s(3.0, replica="r0"), s(1.0, replica="r1")],
    "kv_usage_max": [s(0.5, replica="r0"), s(0.25, replica="r1")],
    "prefix_cache_hit_rate": [s(0.5, replica="r0"), s(None, replica="r1")],
    "prefix_cache_hit_rate_all": [s(0.4)],
    "gpu_util": [s(80.0, replica="r0"), s(20.0, replica="r1")],
    "sm_active": [s(0.6, replica="r0"), s(0.2, replica="r1")],
    "busy_fraction": [s(1.0, replica="r0"), s(0.5, replica="r1")],
    "balancer_queue_max": [s(4.0, proxy="llm")],
    "balancer_responses": [s(10.0, server="r0", code="2xx"), s(1.0, server="r0", code="5xx")],
    "balancer_sessions_avg": [s(2.0, server="http://127.0.0.1:9001")],
    "client_requests_by_outcome": [s(100.0, outcome="ok")],
    "client_ttft_p50": [s(0.06)],
    "client_ttft_buckets": [s(1.0, le="0.05"), s(2.0, le="0.1"), s(2.0, le="+Inf")],
}


def test_collect_assembles_per_replica_figures() -> None:
    querier = Scripted(ANSWERS)
    side = collect(querier, WINDOW, balancer=LB)
    assert all(at == WINDOW.end for _, at in querier.calls)
    r0, r1 = side.replicas
    assert (r0.replica, r0.running_avg, r0.kv_usage_max) == ("r0", 3.0, 0.5)
    assert r0.gpu_util == pytest.approx(0.8) and r0.busy_fraction == pytest.approx(0.8)
    assert (r0.sm_active, r1.sm_active) == (0.6, 0.2)
    assert r1.prefix_cache_hit_rate is None  # NaN (0/0) reads as missing
    # Balance: population std-dev of the SM activities (0.6, 0.2) = 0.2.
    assert side.replica_balance == pytest.approx(0.2) and side.balance_source == "sm_active"
    assert side.prefix_cache_hit_rate == 0.4
    assert side.balancer is not None and side.balancer.name == "lb"
    queue = side.balancer.queues[0]
    assert (queue.pool, queue.max, queue.avg) == ("llm", 4.0, None)
    r0_lb, r1_lb = side.balancer.servers
    assert r0_lb.server == "r0" and dict(r0_lb.responses) == {"2xx": 10.0, "5xx": 1.0}
    # A server the balancer labels by its URL is named as its replica.
    assert (r1_lb.server, r1_lb.sessions_avg, r1_lb.responses) == ("r1", 2.0, {})
    assert side.client is not None and side.client.ttft_buckets == (0.05, 0.1)
    # The query that failed is missing and noted; the others went on.
    assert side.missing == ("preemptions",) and side.incomplete
    assert "query 'preemptions' failed" in side.notes[0]


def _without(*keys: str) -> dict[str, list[Sample]]:
    return {k: v for k, v in ANSWERS.items() if k not in keys}


def test_balance_falls_back_to_gpu_util_without_sm_activity() -> None:
    side = collect(Scripted(_without("sm_active")), WINDOW)
    # Population std-dev of the utilisations (0.8, 0.2) = 0.3.
    assert side.balance_source == "gpu_util" and side.replica_balance == pytest.approx(0.3)
    assert all(r.sm_active is None for r in side.replicas)
    assert any("no DCGM_FI_PROF_SM_ACTIVE series" in n for n in side.notes)


def test_balance_falls_back_to_busy_fraction_without_dcgm() -> None:
    side = collect(Scripted(_without("gpu_util", "sm_active")), WINDOW)
    assert side.balance_source == "busy" and side.replica_balance == pytest.approx(0.25)
    assert any("no DCGM_FI_DEV_GPU_UTIL series" in n for n in side.notes)


def test_sm_activity_without_gpu_util_is_enough() -> None:
    side = collect(Scripted(_without("gpu_util")), WINDOW)
    assert side.balance_source == "sm_active" and side.replica_balance == pytest.approx(0.2)
    assert not any("DCGM" in n for n in side.notes)


def test_sm_activity_of_some_replicas_only_is_not_mixed_with_busy_fractions() -> None:
    answers = {**ANSWERS, "sm_active": [s(0.6, replica="r0")]}
    side = collect(Scripted(answers), WINDOW)
    assert side.balance_source == "gpu_util" and side.replica_balance == pytest.approx(0.3)
    assert any("no DCGM_FI_PROF_SM_ACTIVE for r1" in n for n in side.notes)


def test_an_unknown_balancer_is_neither_queried_nor_reported() -> None:
    querier = Scripted(ANSWERS)
    side = collect(querier, WINDOW)
    assert side.balancer is None
    assert not any(k.startswith("balancer_") for k in side.queries)
    assert not any("lb_" in q for q, _ in querier.calls)


def test_a_balancer_without_such_series_has_an_empty_section() -> None:
    side = collect(Scripted(ANSWERS), WINDOW, balancer=BalancerSeries("nginx"))
    assert side.balancer == BalancerSide(name="nginx")
    assert not any(k.startswith("balancer_") for k in side.queries)


def test_prometheus_dying_mid_collection_keeps_what_it_got() -> None:
    side = collect(Scripted(ANSWERS, die_after=3), WINDOW, balancer=LB)
    assert side.incomplete
    assert side.client is not None and dict(side.client.requests_by_outcome) == {"ok": 100.0}
    assert len(side.missing) == len(promql.server_side_queries(30, balancer=LB)) - 3
    assert side.notes[0].startswith("Prometheus unreachable after 0 s (3 of ")
    assert side.replicas == ()


def _summary() -> RunSummary:
    records = [rec(i, sent=T0 + i * 0.2, ttft=0.05 + i * 1e-3, e2e=0.4) for i in range(120)]
    records.append(rec(999, sent=T0 + 3, outcome="timeout", ttft=None, e2e=10, replica="r1"))
    return summarize(
        records,
        run_start=T0 - 5,
        window=WINDOW,
        scenario="chat",
        target="http://127.0.0.1:8000",
        slo=Slo(ttft_s=0.35, e2e_s=0.8),
        server=collect(Scripted(ANSWERS), WINDOW, balancer=LB),
        generator=GeneratorHealth(lateness_p99_s=0.002, degraded=True, reasons=("CPU 95 %",)),
    )


def test_summary_round_trips_through_json() -> None:
    summary = _summary()
    back = summary_from_data(json.loads(dumps(summary)))
    assert back == summary
    assert summary.incomplete  # the server side had a failed query
    assert summary.cross_check is not None
    assert "query 'preemptions' failed" in " ".join(summary.notes)


def test_newer_schema_is_refused() -> None:
    data = json.loads(dumps(_summary()))
    data["schema_version"] = 99
    with pytest.raises(ConfigError, match="schema_version 99"):
        summary_from_data(data)
    del data["schema_version"]
    with pytest.raises(ConfigError):
        summary_from_data(data)


def test_a_version_1_summary_still_reads_without_its_haproxy_sections() -> None:
    data = json.loads(dumps(_summary()))
    data["schema_version"] = 1
    del data["server"]["balancer"]
    data["server"]["haproxy_queues"] = [{"proxy": "llm", "avg": 1.0, "max": 2.0}]
    data["server"]["haproxy_servers"] = []
    back, now = summary_from_data(data).server, _summary().server
    assert back is not None and now is not None
    assert back.balancer is None and back.replicas == now.replicas


class _Frozen(Scripted):
    """Answers every query, but its newest scrape is ``age_s`` older than the window."""

    def __init__(self, age_s: float) -> None:
        super().__init__(ANSWERS)
        self.age_s = age_s

    def query(self, q: str, at: float | None = None) -> list[Sample]:
        if q == NEWEST_SAMPLE:
            assert at is not None
            return [s(at - self.age_s)]
        return super().query(q, at)


def test_a_prometheus_whose_scrapes_stopped_marks_the_figures_incomplete() -> None:
    """Issue 29: a frozen Prometheus answered with stale series and the report said
    ``incomplete: false`` over zeros."""
    side = collect(_Frozen(age_s=120.0), WINDOW, balancer=LB)
    assert side.incomplete
    assert any("scrapes stopped" in n for n in side.notes)


def test_a_fresh_prometheus_is_not_flagged() -> None:
    side = collect(_Frozen(age_s=1.0), WINDOW, balancer=LB)
    assert not any("scrapes stopped" in n for n in side.notes)


def test_a_frozen_socket_is_unreachable_within_the_timeout() -> None:
    """A Prometheus that accepts the connection and never answers (SIGSTOP): every query is
    bounded by the client's timeout, and the collection says it is incomplete."""
    import socket
    import time

    from lbtune.metrics.prom import PromClient

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        prom = PromClient(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.5)
        began = time.monotonic()
        side = collect(prom, WINDOW, balancer=LB)
        took = time.monotonic() - began
    assert side.incomplete and side.missing
    assert took < 10, f"a frozen Prometheus held the collection for {took:.1f} s"
