"""Where the agent's inputs come from: Prometheus (replica load).

Per replica (grouped by the ``replica`` target label the cluster's scrape config sets):

* ``max by (replica) (vllm:kv_cache_usage_perc)`` — KV-cache usage, 0..1;
* ``sum by (replica) (vllm:num_requests_waiting)`` and ``... running``;
* ``histogram_quantile(q, sum by (replica, le) (rate(vllm:time_to_first_token_seconds_bucket[W])))``
  for q = 0.5 and 0.9 — recent TTFT; NaN (no first token in the window) reads as ``None``.

Which replicas exist comes from the balancer's live weights on every step (a replica is
the balancer's server of the same name), so a reload or a new replica is seen.
"""

from __future__ import annotations

from typing import Protocol

from lbtune.agent.config import AgentConfig
from lbtune.agent.scoring import ReplicaInputs
from lbtune.metrics import promql
from lbtune.metrics.prom import PromClient, Sample

__all__ = ["InputSource", "PrometheusSource", "queries"]


class InputSource(Protocol):
    """What the loop needs: per-replica inputs, or a TargetError when unreachable."""

    def read(self) -> dict[str, ReplicaInputs]: ...


def queries(cfg: AgentConfig) -> dict[str, str]:
    """Input name → PromQL (pure; the agent's whole view of Prometheus)."""
    by = cfg.replica_label
    w = promql.duration(cfg.ttft_window_s)
    ttft = f"sum by ({by}, le) (rate({promql.VLLM_TTFT_BUCKET}[{w}]))"
    return {
        "kv_usage": f"max by ({by}) ({promql.VLLM_KV_USAGE})",
        "waiting": f"sum by ({by}) ({promql.VLLM_WAITING})",
        "running": f"sum by ({by}) ({promql.VLLM_RUNNING})",
        "ttft_p50_s": f"histogram_quantile(0.5, {ttft})",
        "ttft_p90_s": f"histogram_quantile(0.9, {ttft})",
    }


def combine(results: dict[str, list[Sample]], label: str) -> dict[str, ReplicaInputs]:
    """Query results → inputs per replica (a replica needs its KV usage to appear)."""
    values: dict[str, dict[str, float | None]] = {}
    for name, samples in results.items():
        for s in samples:
            replica = s.labels.get(label)
            if replica:
                values.setdefault(replica, {})[name] = s.value
    return {
        r: ReplicaInputs(
            kv_usage=v.get("kv_usage"),
            waiting=v.get("waiting"),
            running=v.get("running"),
            ttft_p50_s=v.get("ttft_p50_s"),
            ttft_p90_s=v.get("ttft_p90_s"),
        )
        for r, v in sorted(values.items())
        if v.get("kv_usage") is not None
    }


class PrometheusSource:
    """Reads :func:`queries` from Prometheus at ``cfg.prometheus_url`` (bounded timeouts)."""

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.client = PromClient(cfg.prometheus_url, timeout_s=cfg.query_timeout_s)

    def read(self) -> dict[str, ReplicaInputs]:
        results = {name: self.client.query(q) for name, q in queries(self.cfg).items()}
        return combine(results, self.cfg.replica_label)
