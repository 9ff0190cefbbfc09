"""The agent's own ``GET /metrics`` (Prometheus text format 0.0.4, by ``prometheus_client``).

Served on ``127.0.0.1:<metrics_port>`` by a daemon thread. Metrics:

* ``lbtune_agent_weight{server}`` — the weight the agent last saw or set, per replica;
* ``lbtune_agent_score{replica}`` — the latest score (0..a+b+c);
* ``lbtune_agent_input{replica,input}`` — raw inputs (``kv_usage``, ``waiting``,
  ``running``, ``ttft_p50_s``, ``ttft_p90_s``) and smoothed, normalised ones
  (``kv_norm``, ``latency_norm``, ``queue_norm``);
* ``lbtune_agent_decisions_total{replica,reason}`` — one per reason per step;
* ``lbtune_agent_errors_total{kind}`` — ``prometheus``, ``balancer``, ``series``, ``config``;
* ``lbtune_agent_iterations_total``, ``lbtune_agent_enabled``,
  ``lbtune_agent_last_success_timestamp_seconds`` (Unix time of the last full step).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from lbtune.agent.scoring import Decision

__all__ = ["AgentMetrics", "ExporterServer"]

_HELP = {
    "lbtune_agent_weight": ("gauge", "Balancer weight the agent last saw or set."),
    "lbtune_agent_score": ("gauge", "Replica score a*(1-kv)+b*(1-latency)+c*(1-queue)."),
    "lbtune_agent_input": ("gauge", "Agent inputs per replica: raw and smoothed normalised."),
    "lbtune_agent_decisions_total": ("counter", "Decisions per replica and reason."),
    "lbtune_agent_errors_total": ("counter", "Failed steps by kind."),
    "lbtune_agent_iterations_total": ("counter", "Steps run."),
    "lbtune_agent_enabled": ("gauge", "1 when the agent pushes weights, 0 when it observes."),
    "lbtune_agent_last_success_timestamp_seconds": ("gauge", "Unix time of the last full step."),
}
Key = tuple[tuple[str, str], ...]


class AgentMetrics(Collector):
    """Thread-safe store of the agent's series; :meth:`render` writes the text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self)
        self._series: dict[str, dict[Key, float]] = {name: {} for name in _HELP}
        self._series["lbtune_agent_iterations_total"][()] = 0.0

    def _set(self, name: str, labels: Key, value: float) -> None:
        self._series[name][labels] = value

    def _inc(self, name: str, labels: Key, by: float = 1.0) -> None:
        self._series[name][labels] = self._series[name].get(labels, 0.0) + by

    def error(self, kind: str) -> None:
        with self._lock:
            self._inc("lbtune_agent_errors_total", (("kind", kind),))

    def iteration(self, enabled: bool) -> None:
        with self._lock:
            self._inc("lbtune_agent_iterations_total", ())
            self._set("lbtune_agent_enabled", (), 1.0 if enabled else 0.0)

    def success(self, at: float) -> None:
        with self._lock:
            self._set("lbtune_agent_last_success_timestamp_seconds", (), at)

    def weights(self, weights: Iterable[tuple[str, int]]) -> None:
        """(replica, weight) of every managed replica (replaces the old set); the label is
        ``server``, the balancer's name for the replica."""
        with self._lock:
            self._series["lbtune_agent_weight"] = {(("server", r),): float(w) for r, w in weights}

    def decisions(self, decisions: Iterable[Decision]) -> None:
        with self._lock:
            scores: dict[Key, float] = {}
            inputs: dict[Key, float] = {}
            for d in decisions:
                rl = ("replica", d.replica)
                for reason in d.reasons:
                    self._inc("lbtune_agent_decisions_total", (rl, ("reason", reason)))
                if d.score is not None:
                    scores[(rl,)] = d.score
                values: dict[str, float | None] = {}
                if d.raw is not None:
                    values.update(
                        kv_usage=d.raw.kv_usage,
                        waiting=d.raw.waiting,
                        running=d.raw.running,
                        ttft_p50_s=d.raw.ttft_p50_s,
                        ttft_p90_s=d.raw.ttft_p90_s,
                    )
                if d.smoothed is not None:
                    values.update(
                        kv_norm=d.smoothed.kv,
                        latency_norm=d.smoothed.latency,
                        queue_norm=d.smoothed.queue,
                    )
                for name, v in values.items():
                    if v is not None:
                        inputs[(rl, ("input", name))] = float(v)
            self._series["lbtune_agent_score"] = scores
            self._series["lbtune_agent_input"] = inputs

    def value(self, name: str, **labels: str) -> float | None:
        """One sample (for tests and the CLI); ``None`` when absent."""
        key = tuple(labels.items())
        with self._lock:
            for k, v in self._series.get(name, {}).items():
                if sorted(k) == sorted(key):
                    return v
        return None

    def render(self) -> str:
        """The exposition text (format 0.0.4), written by ``prometheus_client``."""
        return generate_latest(self._registry).decode()

    def collect(self) -> Iterable[Metric]:
        """Every non-empty family, built under the lock at scrape time (``Collector``)."""
        out: list[Metric] = []
        with self._lock:
            for name, (kind, help_text) in _HELP.items():
                series = self._series[name]
                if not series:
                    continue
                labels = [k for k, _ in next(iter(series))]
                family = _FAMILIES[kind](name, help_text, labels=labels)
                for key, v in sorted(series.items()):
                    family.add_metric([x for _, x in key], v)
                out.append(family)
        return out


_FAMILIES: dict[str, type[CounterMetricFamily] | type[GaugeMetricFamily]] = {
    "counter": CounterMetricFamily,
    "gauge": GaugeMetricFamily,
}


class _Handler(BaseHTTPRequestHandler):
    metrics: AgentMetrics

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404, "only /metrics here")
            return
        body = self.server.metrics.render().encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        pass


class ExporterServer:
    """``/metrics`` on 127.0.0.1:``port`` (0 = a free port) in a daemon thread."""

    def __init__(self, metrics: AgentMetrics, port: int = 0, host: str = "127.0.0.1") -> None:
        self._httpd = ThreadingHTTPServer((host, port), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.metrics = metrics  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="lbtune-agent-exporter", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self) -> ExporterServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
