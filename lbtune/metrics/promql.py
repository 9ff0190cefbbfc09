"""PromQL builders (pure strings) for the figures read from Prometheus.

Every query is an *instant* query evaluated at the window's end ``t1`` with a
range selector ``[W]`` covering the window (``W = t1 - t0``), so that each figure
covers exactly the measurement window. Per-replica figures group by the
``replica`` target label that the cluster's scrape config sets; the balancer's own
figures group by the labels of its exporter, which its registry entry names
(:class:`BalancerSeries`: metrics knows no balancer by name).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

REPLICA = "replica"

VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_KV_USAGE = "vllm:kv_cache_usage_perc"
VLLM_PREFIX_HITS = "vllm:prefix_cache_hits_total"
VLLM_PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"
VLLM_SUCCESS = "vllm:request_success_total"
SERVED_REASONS = '{finished_reason=~"stop|length|repetition"}'
"""The ``finished_reason`` values of a request that was served to its end."""
VLLM_TTFT_BUCKET = "vllm:time_to_first_token_seconds_bucket"
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
DCGM_SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
LBTUNE_REQUESTS = "lbtune_requests_total"
LBTUNE_TTFT_BUCKET = "lbtune_ttft_seconds_bucket"
LBTUNE_E2E_BUCKET = "lbtune_e2e_seconds_bucket"
LBTUNE_ITL_BUCKET = "lbtune_itl_seconds_bucket"
LBTUNE_OUTPUT_TOKENS = "lbtune_output_tokens_total"


def duration(seconds: float) -> str:
    """A PromQL duration: whole seconds as ``30s``, else milliseconds (``2500ms``)."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"a PromQL range must be positive, got {seconds!r} s")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def avg_by(metric: str, window_s: float, by: str = REPLICA, agg: str = "sum") -> str:
    """``agg by (label) (avg_over_time(metric[W]))``; ``sum`` adds a replica's series."""
    return f"{agg} by ({by}) (avg_over_time({metric}[{duration(window_s)}]))"


def max_by(metric: str, window_s: float, by: str = REPLICA) -> str:
    return f"max by ({by}) (max_over_time({metric}[{duration(window_s)}]))"


def increase_by(metric: str, window_s: float, by: str = REPLICA, selector: str = "") -> str:
    return f"sum by ({by}) (increase({metric}{selector}[{duration(window_s)}]))"


def ratio_of_increases(num: str, den: str, window_s: float, by: str | None = REPLICA) -> str:
    """``increase(num) / increase(den)`` (NaN, read as missing, when nothing was counted)."""
    w = duration(window_s)
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (increase({num}[{w}])) / sum{grouping} (increase({den}[{w}]))"


def histogram_quantile(
    q: float, bucket_metric: str, window_s: float, by: str | None = None, selector: str = ""
) -> str:
    labels = f"{by}, le" if by else "le"
    return (
        f"histogram_quantile({q:g}, sum by ({labels}) "
        f"(increase({bucket_metric}{selector}[{duration(window_s)}])))"
    )


def busy_fraction(window_s: float, step_s: float = 1.0) -> str:
    """Fraction of the window with at least one running request (subquery at ``step_s``)."""
    return (
        f"avg_over_time((sum by ({REPLICA}) ({VLLM_RUNNING}) > bool 0)"
        f"[{duration(window_s)}:{duration(step_s)}])"
    )


@dataclass(frozen=True)
class BalancerSeries:
    """Which of a balancer's own Prometheus series give the run summary's ``balancer``
    section (:class:`lbtune.metrics.summary.BalancerSide`). A balancer's registry entry
    says (``BalancerBase.series``); a series it does not have is ``None`` and its figures
    stay empty."""

    balancer: str
    """The balancer's registry name."""
    queue: str | None = None
    """A gauge: requests waiting for a server, per pool (per-model backend or cluster)."""
    pool_label: str = "pool"
    """The label naming the pool on :attr:`queue`."""
    sessions: str | None = None
    """A gauge: requests open to each server."""
    responses: str | None = None
    """A counter: responses from each server, by code class."""
    server_label: str = "server"
    """The label naming the server on :attr:`sessions` and :attr:`responses`."""
    code_label: str = "code"
    """The label holding the code class (``2xx``...) on :attr:`responses`."""
    server_names: Mapping[str, str] = field(default_factory=dict)
    """Server label value -> replica name, where the balancer labels a server otherwise
    (e.g. by its URL); values not in it are kept as they are."""


def balancer_queries(series: BalancerSeries, window_s: float) -> dict[str, str]:
    """The queries of the balancer's own series (those it has), by key."""
    w = window_s
    out: dict[str, str] = {}
    if series.queue is not None:
        out["balancer_queue_avg"] = avg_by(series.queue, w, by=series.pool_label)
        out["balancer_queue_max"] = max_by(series.queue, w, by=series.pool_label)
    if series.sessions is not None:
        out["balancer_sessions_avg"] = avg_by(series.sessions, w, by=series.server_label)
        out["balancer_sessions_max"] = max_by(series.sessions, w, by=series.server_label)
    if series.responses is not None:
        by = f"{series.server_label}, {series.code_label}"
        out["balancer_responses"] = increase_by(series.responses, w, by)
    return out


def server_side_queries(
    window_s: float,
    *,
    job: str = "lbtune",
    step_s: float = 1.0,
    balancer: BalancerSeries | None = None,
) -> dict[str, str]:
    """Every query :func:`lbtune.metrics.serverside.collect` sends, by key, in order
    (``balancer``: the balancer's own series, last)."""
    sel = f'{{job="{job}"}}'
    w = window_s
    return {
        # lbtune's own exporter first: it is what the cross-check needs.
        "client_requests_by_outcome": increase_by(LBTUNE_REQUESTS, w, "outcome", sel),
        "client_requests_by_replica": increase_by(LBTUNE_REQUESTS, w, REPLICA, sel),
        "client_ttft_p50": histogram_quantile(0.5, LBTUNE_TTFT_BUCKET, w, selector=sel),
        "client_ttft_p99": histogram_quantile(0.99, LBTUNE_TTFT_BUCKET, w, selector=sel),
        "client_ttft_buckets": increase_by(LBTUNE_TTFT_BUCKET, w, "le", sel),
        "client_e2e_p50": histogram_quantile(0.5, LBTUNE_E2E_BUCKET, w, selector=sel),
        "client_e2e_p99": histogram_quantile(0.99, LBTUNE_E2E_BUCKET, w, selector=sel),
        "client_e2e_buckets": increase_by(LBTUNE_E2E_BUCKET, w, "le", sel),
        "client_output_tokens": f"sum(increase({LBTUNE_OUTPUT_TOKENS}{sel}[{duration(w)}]))",
        # vLLM, per replica.
        "running_avg": avg_by(VLLM_RUNNING, w),
        "running_max": max_by(VLLM_RUNNING, w),
        "waiting_avg": avg_by(VLLM_WAITING, w),
        "waiting_max": max_by(VLLM_WAITING, w),
        "kv_usage_avg": avg_by(VLLM_KV_USAGE, w, agg="max"),
        "kv_usage_max": max_by(VLLM_KV_USAGE, w),
        "prefix_cache_hit_rate": ratio_of_increases(VLLM_PREFIX_HITS, VLLM_PREFIX_QUERIES, w),
        "prefix_cache_hit_rate_all": ratio_of_increases(
            VLLM_PREFIX_HITS, VLLM_PREFIX_QUERIES, w, by=None
        ),
        "preemptions": increase_by(VLLM_PREEMPTIONS, w),
        # Served requests only: vLLM also counts finished_reason="error" (and "abort").
        "requests_finished": increase_by(VLLM_SUCCESS, w, selector=SERVED_REASONS),
        "server_ttft_p50": histogram_quantile(0.5, VLLM_TTFT_BUCKET, w, by=REPLICA),
        "server_ttft_p99": histogram_quantile(0.99, VLLM_TTFT_BUCKET, w, by=REPLICA),
        # GPUs (DCGM: utilisation in percent, SM activity 0..1) and the fallback busy fraction.
        "gpu_util": avg_by(DCGM_GPU_UTIL, w, agg="avg"),
        "sm_active": avg_by(DCGM_SM_ACTIVE, w, agg="avg"),
        "busy_fraction": busy_fraction(w, step_s),
        # The balancer's own exporter.
        **(balancer_queries(balancer, w) if balancer is not None else {}),
    }
