"""Client-side Prometheus exporter: ``GET /metrics`` while the test runs.

Text exposition format written by ``prometheus_client`` from families built at scrape
time (the registry is its own collector). Served on
``127.0.0.1:<exporter_port>``; the cluster's Prometheus scrapes it as job
``lbtune``. Fed from the same per-request records that the summary is computed
from, so Prometheus and the Parquet file can be cross-checked.

Metrics:

* histograms ``lbtune_ttft_seconds``, ``lbtune_itl_seconds``,
  ``lbtune_e2e_seconds`` {replica, model} — successful requests only;
* counters ``lbtune_requests_total`` {outcome, replica},
  ``lbtune_output_tokens_total`` {replica}, ``lbtune_prompt_tokens_total`` {replica};
* gauges ``lbtune_in_flight``, ``lbtune_generator_lateness_seconds`` {worker}
  (last second's P99), ``lbtune_generator_cpu_percent`` {worker}.

Labels carry only replica, model, outcome and worker names: never a header
value, URL or key.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from lbtune.records.requests import RequestRecord
from lbtune.sim.metrics import Histogram

__all__ = ["E2E_BUCKETS", "ITL_BUCKETS", "TTFT_BUCKETS", "ExporterServer", "MetricsRegistry"]

TTFT_BUCKETS = (
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.06,
    0.075,
    0.1,
    0.125,
    0.15,
    0.2,
    0.25,
    0.3,
    0.35,
    0.4,
    0.5,
    0.6,
    0.75,
    0.8,
    1.0,
    1.25,
    1.5,
    2.0,
    2.5,
    3.0,
    4.0,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
)
ITL_BUCKETS = (
    0.001,
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.0125,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.0,
    5.0,
)
_ITL_EDGES = np.asarray(ITL_BUCKETS)
E2E_BUCKETS = (
    0.05,
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.8,
    1.0,
    1.25,
    1.5,
    2.0,
    2.5,
    3.0,
    4.0,
    5.0,
    6.0,
    8.0,
    10.0,
    15.0,
    20.0,
    30.0,
    45.0,
    60.0,
    90.0,
    120.0,
    180.0,
    300.0,
)


class MetricsRegistry(Collector):
    """Thread-safe client-side metrics, fed one record at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self)
        self._hist: dict[str, dict[tuple[str, str], Histogram]] = {
            "ttft": {},
            "itl": {},
            "e2e": {},
        }
        self._requests: dict[tuple[str, str], int] = {}
        self._out_tokens: dict[str, int] = {}
        self._prompt_tokens: dict[str, int] = {}
        self._in_flight = 0
        self._lateness: dict[str, float] = {}
        self._cpu: dict[str, float] = {}

    def observe(self, r: RequestRecord) -> None:
        replica = r.replica or "unknown"
        key = (replica, r.model)
        with self._lock:
            rk = (r.outcome, replica)
            self._requests[rk] = self._requests.get(rk, 0) + 1
            if r.output_tokens:
                self._out_tokens[replica] = self._out_tokens.get(replica, 0) + r.output_tokens
            if r.prompt_tokens:
                self._prompt_tokens[replica] = self._prompt_tokens.get(replica, 0) + r.prompt_tokens
            if r.outcome != "ok":
                return
            self._get("e2e", key, E2E_BUCKETS).observe(r.e2e)
            ttft = r.ttft
            if ttft is not None:
                self._get("ttft", key, TTFT_BUCKETS).observe(ttft)
            if len(r.chunk_times) > 1:  # vectorised: 127 gaps a request, hundreds a second
                gaps = np.diff(np.asarray(r.chunk_times))
                slots = np.searchsorted(_ITL_EDGES, gaps)  # side "left": bisect_left's slot
                self._get("itl", key, ITL_BUCKETS).add(
                    np.bincount(slots, minlength=len(ITL_BUCKETS) + 1).tolist(), float(gaps.sum())
                )

    def _get(self, name: str, key: tuple[str, str], bounds: Sequence[float]) -> Histogram:
        h = self._hist[name].get(key)
        if h is None:
            h = self._hist[name][key] = Histogram(bounds)
        return h

    def set_in_flight(self, n: int) -> None:
        self._in_flight = n

    def set_generator(self, worker: str, lateness_s: float | None, cpu_percent: float) -> None:
        with self._lock:
            if lateness_s is not None:
                self._lateness[worker] = lateness_s
            self._cpu[worker] = cpu_percent

    def render(self) -> str:
        """The exposition text (format 0.0.4), written by ``prometheus_client``."""
        return generate_latest(self._registry).decode()

    def collect(self) -> Iterable[Metric]:
        """Every family, built under the lock at scrape time (``Collector`` protocol)."""
        out: list[Metric] = []
        with self._lock:
            for name, help_text in (
                ("ttft", "Time to first non-empty content chunk (request sent -> chunk)."),
                ("itl", "Gaps between consecutive content chunks."),
                ("e2e", "Request sent -> last byte of the response."),
            ):
                hist = HistogramMetricFamily(
                    f"lbtune_{name}_seconds", help_text, labels=["replica", "model"]
                )
                for (replica, model), h in sorted(self._hist[name].items()):
                    hist.add_metric([replica, model], h.buckets(), h.sum)
                out.append(hist)
            requests = CounterMetricFamily(
                "lbtune_requests_total",
                "Requests by outcome (each sent one counted once).",
                labels=["outcome", "replica"],
            )
            for (outcome, replica), n in sorted(self._requests.items()):
                requests.add_metric([outcome, replica], n)
            out.append(requests)
            for metric, data, text in (
                ("lbtune_output_tokens_total", self._out_tokens, "Output tokens received."),
                ("lbtune_prompt_tokens_total", self._prompt_tokens, "Prompt tokens sent."),
            ):
                counter = CounterMetricFamily(metric, text, labels=["replica"])
                for replica, n in sorted(data.items()):
                    counter.add_metric([replica], n)
                out.append(counter)
            out.append(
                GaugeMetricFamily(
                    "lbtune_in_flight", "Requests sent and not yet ended.", value=self._in_flight
                )
            )
            for metric, gdata, text in (
                (
                    "lbtune_generator_lateness_seconds",
                    self._lateness,
                    "P99 open-loop send lateness over the last second.",
                ),
                ("lbtune_generator_cpu_percent", self._cpu, "CPU of a generator process."),
            ):
                gauge = GaugeMetricFamily(metric, text, labels=["worker"])
                for worker, v in sorted(gdata.items()):
                    gauge.add_metric([worker], v)
                out.append(gauge)
        return out


class ExporterServer:
    """Serves a registry's ``/metrics`` from a daemon thread."""

    def __init__(self, registry: MetricsRegistry, port: int, host: str = "127.0.0.1") -> None:
        reg = registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                body = reg.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="lbtune-exporter", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
