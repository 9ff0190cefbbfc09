"""The PromQL builders produce exactly these strings."""

from __future__ import annotations

import pytest

from lbtune.metrics import promql


def test_durations() -> None:
    assert promql.duration(30) == "30s"
    assert promql.duration(2.5) == "2500ms"
    assert promql.duration(0.25) == "250ms"
    with pytest.raises(ValueError):
        promql.duration(0)


LB = promql.BalancerSeries(
    "lb",
    queue="lb_queue",
    pool_label="proxy",
    sessions="lb_sessions",
    responses="lb_responses_total",
    server_label="server",
    code_label="code",
)


def test_server_side_queries_are_exact() -> None:
    q = promql.server_side_queries(30, job="lbtune", step_s=1, balancer=LB)
    assert q["running_avg"] == "sum by (replica) (avg_over_time(vllm:num_requests_running[30s]))"
    assert q["running_max"] == "max by (replica) (max_over_time(vllm:num_requests_running[30s]))"
    assert q["waiting_avg"] == "sum by (replica) (avg_over_time(vllm:num_requests_waiting[30s]))"
    assert q["kv_usage_avg"] == "max by (replica) (avg_over_time(vllm:kv_cache_usage_perc[30s]))"
    assert q["kv_usage_max"] == "max by (replica) (max_over_time(vllm:kv_cache_usage_perc[30s]))"
    assert q["prefix_cache_hit_rate"] == (
        "sum by (replica) (increase(vllm:prefix_cache_hits_total[30s])) / "
        "sum by (replica) (increase(vllm:prefix_cache_queries_total[30s]))"
    )
    assert q["prefix_cache_hit_rate_all"] == (
        "sum (increase(vllm:prefix_cache_hits_total[30s])) / "
        "sum (increase(vllm:prefix_cache_queries_total[30s]))"
    )
    assert q["preemptions"] == "sum by (replica) (increase(vllm:num_preemptions_total[30s]))"
    assert q["server_ttft_p99"] == (
        "histogram_quantile(0.99, sum by (replica, le) "
        "(increase(vllm:time_to_first_token_seconds_bucket[30s])))"
    )
    assert q["gpu_util"] == "avg by (replica) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[30s]))"
    assert q["sm_active"] == "avg by (replica) (avg_over_time(DCGM_FI_PROF_SM_ACTIVE[30s]))"
    assert q["busy_fraction"] == (
        "avg_over_time((sum by (replica) (vllm:num_requests_running) > bool 0)[30s:1s])"
    )
    assert q["balancer_queue_avg"] == "sum by (proxy) (avg_over_time(lb_queue[30s]))"
    assert q["balancer_sessions_max"] == "max by (server) (max_over_time(lb_sessions[30s]))"
    assert q["balancer_responses"] == ("sum by (server, code) (increase(lb_responses_total[30s]))")
    assert q["client_requests_by_outcome"] == (
        'sum by (outcome) (increase(lbtune_requests_total{job="lbtune"}[30s]))'
    )
    assert q["client_ttft_p50"] == (
        'histogram_quantile(0.5, sum by (le) (increase(lbtune_ttft_seconds_bucket{job="lbtune"}'
        "[30s])))"
    )
    assert q["client_e2e_buckets"] == (
        'sum by (le) (increase(lbtune_e2e_seconds_bucket{job="lbtune"}[30s]))'
    )
    assert q["client_output_tokens"] == (
        'sum(increase(lbtune_output_tokens_total{job="lbtune"}[30s]))'
    )


def test_only_the_balancer_series_it_names_are_queried() -> None:
    assert not any(k.startswith("balancer_") for k in promql.server_side_queries(30))
    queue_only = promql.BalancerSeries("q", queue="q_pending", pool_label="cluster")
    q = promql.server_side_queries(30, balancer=queue_only)
    assert sorted(k for k in q if k.startswith("balancer_")) == [
        "balancer_queue_avg",
        "balancer_queue_max",
    ]
    assert q["balancer_queue_max"] == "max by (cluster) (max_over_time(q_pending[30s]))"
    assert list(q)[-2:] == ["balancer_queue_avg", "balancer_queue_max"]  # last


def test_fractional_window_and_job() -> None:
    q = promql.server_side_queries(12.5, job="lb2", step_s=0.25)
    assert q["busy_fraction"].endswith("[12500ms:250ms])")
    assert q["sm_active"] == "avg by (replica) (avg_over_time(DCGM_FI_PROF_SM_ACTIVE[12500ms]))"
    assert '{job="lb2"}[12500ms]' in q["client_requests_by_replica"]
