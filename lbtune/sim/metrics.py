"""What a simulated replica reports about itself on ``/metrics``.

Prometheus (``GET /metrics``, text exposition format 0.0.4, written by ``prometheus_client``
from families computed at scrape time):

* Engine-level gauges — exactly one series per replica, whatever the number of
  served models, so that ``count(vllm:num_requests_running)`` equals the number of
  replicas. A replica has one engine; these gauges carry ``model_name`` = the
  replica's *first* served model: ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (0..1).
* Counters from the engine, one series per served model (``model_name`` = the
  requests' model): ``vllm:prefix_cache_queries_total`` and
  ``vllm:prefix_cache_hits_total`` (tokens), ``vllm:num_preemptions_total``,
  ``vllm:prompt_tokens_total`` (a request's prompt length, counted when its first
  token is produced, as vLLM v1 does), ``vllm:generation_tokens_total``.
* Per-request series kept by the server, labelled with the request's model:
  ``vllm:request_success_total{finished_reason="stop|length|abort|error|repetition"}``
  (vLLM 0.32's label values; the sim counts only ``stop`` and ``length``: a request
  whose client went away is counted nowhere, as in vLLM, and the sim has no errors
  or repetition detection mid-request) and histograms ``vllm:time_to_first_token_seconds`` (arrival
  at the server to first token), ``vllm:inter_token_latency_seconds``,
  ``vllm:e2e_request_latency_seconds``, ``vllm:request_queue_time_seconds`` (engine
  arrival to first scheduling) with vLLM's bucket boundaries
  (``vllm/v1/metrics/loggers.py``). Times are wall-clock seconds, i.e. already
  divided by the host's time scale, so they compare with what clients measure.
* GPU gauges with DCGM exporter names, labels ``gpu="0"`` and ``modelName`` = the
  GPU profile: ``DCGM_FI_DEV_GPU_UTIL`` (percentage of wall time the engine had
  work, over the interval since the newest earlier scrape at least 0.5 s old —
  with a 1 s scrape interval, the last interval), ``DCGM_FI_PROF_SM_ACTIVE`` (0..1, over
  the same interval: the time-weighted mean of each step's arithmetic share of its time,
  idle time counting 0 — it tells a replica running one request from one running 200,
  where GPU_UTIL is 100 for both; see ``docs/simulator.md``), ``DCGM_FI_DEV_FB_USED`` and
  ``DCGM_FI_DEV_FB_FREE`` (MiB: weights + KV blocks in use, and the rest).

No ``replica`` label is written: Prometheus adds its target labels.

The per-request ground truth (``GET /debug/requests/{id}``) is :mod:`lbtune.sim.groundtruth`.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_go_float: Callable[[float], str] = floatToGoString
"""``prometheus_client``'s number format (the library leaves it untyped)."""

TTFT_BUCKETS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
"""vLLM's ``vllm:time_to_first_token_seconds`` boundaries."""
ITL_BUCKETS: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
"""vLLM's ``vllm:inter_token_latency_seconds`` (and time-per-output-token) boundaries."""
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
"""vLLM's boundaries for e2e latency and queue time."""

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
"""vLLM's ``finished_reason`` label values, all exposed (at 0 when never counted)."""
_MIB = 1024 * 1024


class Histogram:
    """A Prometheus histogram: per-bucket counts, sum and count."""

    __slots__ = ("_les", "bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # last slot: above every bound
        self.sum = 0.0
        self.count = 0
        self._les = (*(_go_float(b) for b in self.bounds), "+Inf")

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, ``+Inf`` last."""
        return list(zip(self._les, accumulate(self.counts), strict=True))

    def observe(self, value: float, n: int = 1) -> None:
        """Record ``n`` observations of ``value`` (``le`` is inclusive)."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def add(self, counts: Sequence[int], total: float) -> None:
        """Record observations bucketed already: ``counts[i]`` of them in slot ``i`` (where
        :meth:`observe` puts a value: the first bound ``>=`` it, the last slot above all),
        their values summing to ``total``."""
        self.counts = [a + b for a, b in zip(self.counts, counts, strict=True)]
        self.sum += total
        self.count += sum(counts)


class EngineView(Protocol):
    """What the exporter reads from the engine (:class:`lbtune.sim.engine.Engine`)."""

    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def kv_usage(self) -> float: ...
    @property
    def memory_used_bytes(self) -> int: ...
    @property
    def memory_total_bytes(self) -> int: ...
    @property
    def model_stats(self) -> Mapping[str, Any]: ...
    @property
    def kv_capacity_blocks(self) -> int: ...
    @property
    def config(self) -> Any: ...


class LevelClock:
    """The wall-time integral of a level in 0..1 that changes at known instants, and its
    time-weighted average over the interval between scrapes."""

    def __init__(self) -> None:
        now = time.monotonic()
        self._total = 0.0
        self._level = 0.0
        self._since = now
        self._snapshots: deque[tuple[float, float]] = deque([(now, 0.0)], maxlen=64)

    @property
    def level(self) -> float:
        return self._level

    def set(self, now: float, level: float) -> None:
        """From ``now`` on the level is ``level`` (clamped to 0..1)."""
        self._total += max(0.0, now - self._since) * self._level
        self._since = now
        self._level = max(0.0, min(1.0, level))

    def seconds(self, now: float) -> float:
        """The integral up to ``now``: seconds at level 1, equivalently."""
        return self._total + max(0.0, now - self._since) * self._level

    def average(self, now: float) -> float:
        """Mean level (0..1) since the newest snapshot at least 0.5 s old; takes a snapshot."""
        value = self.seconds(now)
        base_t, base_v = self._snapshots[0]
        for t, v in reversed(self._snapshots):
            if now - t >= 0.5:
                base_t, base_v = t, v
                break
        self._snapshots.append((now, value))
        span = now - base_t
        if span <= 0:
            return 0.0
        return max(0.0, min(1.0, (value - base_v) / span))


class BusyClock(LevelClock):
    """Wall time during which the engine had work, and the utilisation over scrapes."""

    def start(self, now: float) -> None:
        if self.level == 0.0:
            self.set(now, 1.0)

    def stop(self, now: float) -> None:
        self.set(now, 0.0)

    def busy_seconds(self, now: float) -> float:
        return self.seconds(now)

    def utilisation(self, now: float) -> float:
        """Busy percentage since the newest snapshot at least 0.5 s old; takes a snapshot."""
        return 100.0 * self.average(now)


class ModelMetrics:
    """Per-request counters and histograms of one model on one replica."""

    def __init__(self) -> None:
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue = Histogram(REQUEST_LATENCY_BUCKETS)


class ReplicaMetrics:
    """Everything ``GET /metrics`` of one replica shows."""

    def __init__(self, models: Sequence[str], gpu_name: str) -> None:
        self.primary_model = models[0]
        self.gpu_name = gpu_name
        self.models = {m: ModelMetrics() for m in models}
        self.busy = BusyClock()
        self.sm_active = LevelClock()
        """SM activity of the step running (:attr:`lbtune.sim.engine.StepResult.activity`),
        0 while idle: its average over a scrape interval is ``DCGM_FI_PROF_SM_ACTIVE``."""

    def render(self, engine: EngineView, now: float | None = None) -> str:
        """The exposition text (format 0.0.4), written by ``prometheus_client``."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Scrape(self.families(engine, now)))
        return generate_latest(registry).decode()

    def families(self, engine: EngineView, now: float | None = None) -> list[Metric]:
        """One scrape's metric families, in exposition order (takes the GPU snapshots)."""
        now = time.monotonic() if now is None else now
        out: list[Metric] = []
        one = [self.primary_model]
        for name, value in (
            ("vllm:num_requests_running", engine.num_running),
            ("vllm:num_requests_waiting", engine.num_waiting),
            ("vllm:kv_cache_usage_perc", engine.kv_usage),
        ):
            gauge = GaugeMetricFamily(name, HELP[name], labels=["model_name"])
            gauge.add_metric(one, value)
            out.append(gauge)
        cfg = engine.config
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            HELP["vllm:cache_config_info"],
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching"],
        )
        info.add_metric(
            [str(cfg.block_size), str(engine.kv_capacity_blocks), str(cfg.enable_prefix_caching)],
            1.0,
        )
        out.append(info)
        stats = [(m, engine.model_stats[m]) for m in self.models]
        for name, attr in (
            ("vllm:prefix_cache_queries_total", "prefix_cache_queries"),
            ("vllm:prefix_cache_hits_total", "prefix_cache_hits"),
            ("vllm:num_preemptions_total", "num_preemptions"),
            ("vllm:prompt_tokens_total", "prompt_tokens"),
            ("vllm:generation_tokens_total", "generation_tokens"),
        ):
            counter = CounterMetricFamily(name, HELP[name], labels=["model_name"])
            for m, st in stats:
                counter.add_metric([m], getattr(st, attr))
            out.append(counter)
        name = "vllm:request_success_total"
        success = CounterMetricFamily(name, HELP[name], labels=["model_name", "finished_reason"])
        for m, mm in self.models.items():
            for reason in FINISH_REASONS:
                success.add_metric([m, reason], mm.success[reason])
        out.append(success)
        for name, attr in (
            ("vllm:time_to_first_token_seconds", "ttft"),
            ("vllm:inter_token_latency_seconds", "itl"),
            ("vllm:e2e_request_latency_seconds", "e2e"),
            ("vllm:request_queue_time_seconds", "queue"),
        ):
            hist = HistogramMetricFamily(name, HELP[name], labels=["model_name"])
            for m, mm in self.models.items():
                h: Histogram = getattr(mm, attr)
                hist.add_metric([m], h.buckets(), h.sum)
            out.append(hist)
        gpu = ["0", self.gpu_name]
        used = engine.memory_used_bytes / _MIB
        free = max(0.0, engine.memory_total_bytes / _MIB - used)
        for name, value in (
            ("DCGM_FI_DEV_GPU_UTIL", round(self.busy.utilisation(now), 3)),
            ("DCGM_FI_PROF_SM_ACTIVE", round(self.sm_active.average(now), 4)),
            ("DCGM_FI_DEV_FB_USED", round(used)),
            ("DCGM_FI_DEV_FB_FREE", round(free)),
        ):
            gauge = GaugeMetricFamily(name, HELP[name], labels=["gpu", "modelName"])
            gauge.add_metric(gpu, value)
            out.append(gauge)
        return out


class _Scrape(Collector):
    """Families computed for one scrape, handed to ``generate_latest``."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


HELP = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:cache_config_info": "Information of the LLMEngine CacheConfig",
    "vllm:prefix_cache_queries_total": "Prefix cache queries, in queried tokens.",
    "vllm:prefix_cache_hits_total": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:num_preemptions_total": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens_total": "Number of prefill tokens processed.",
    "vllm:generation_tokens_total": "Number of generation tokens processed.",
    "vllm:request_success_total": "Count of successfully processed requests.",
    "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "vllm:inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "vllm:e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "vllm:request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_PROF_SM_ACTIVE": "The ratio of cycles an SM has at least 1 warp assigned.",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
}
"""Every metric name ``/metrics`` exposes, with its help text."""
