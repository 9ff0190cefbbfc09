"""The run summary: frozen dataclasses passed around in code.

``summary.json`` is their JSON form (the CI contract, see ``docs/summary-schema.md``),
written and read by :mod:`lbtune.metrics.summary_file` through a pydantic ``TypeAdapter``
of :class:`RunSummary`: every field, in field order. All times are in seconds, all
fractions in 0..1, timestamps are Unix wall-clock seconds. A figure that could not be
computed is ``None`` (JSON ``null``), never NaN.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from lbtune.records.quantiles import LatencyStats
from lbtune.records.slo import Slo

SCHEMA_VERSION = 2
"""Bumped on any incompatible change of the JSON form (a renamed or removed field).
2: ``server.haproxy_queues``/``haproxy_servers`` became ``server.balancer``."""


@dataclass(frozen=True)
class Window:
    """A half-open wall-clock interval ``[start, end)``."""

    start: float
    end: float

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)

    def contains(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True)
class Latencies:
    ttft: LatencyStats
    itl: LatencyStats
    tpot: LatencyStats
    e2e: LatencyStats
    ttft_from_schedule: LatencyStats | None = None
    """Open loop only: first token minus the scheduled send time."""
    e2e_from_schedule: LatencyStats | None = None


@dataclass(frozen=True)
class Outcomes:
    """Requests sent in a window, each counted in exactly one outcome."""

    sent: int
    counts: Mapping[str, int]
    error_rate: float | None
    """``(sent - ok) / sent``; ``None`` when nothing was sent."""
    rates: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Throughput:
    completed: int
    """Successful requests that ended in the window."""
    requests_per_s: float
    output_tokens: int
    output_tokens_per_s: float
    sent_per_s: float
    goodput_requests: int | None = None
    goodput_per_s: float | None = None


@dataclass(frozen=True)
class ReplicaStats:
    replica: str
    sent: int
    share: float
    ok: int
    errors: int
    error_rate: float | None
    errors_by_outcome: Mapping[str, int] = field(default_factory=dict)
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    e2e_p50: float | None = None
    e2e_p99: float | None = None
    too_few_samples: tuple[str, ...] = ()
    balancer_errors: int = 0
    """Of ``errors``: ones the balancer answered itself (no replica header) while this
    replica was down or failing, attributed here (see :class:`ReplicaEvents`)."""


@dataclass(frozen=True)
class ReplicaOutage:
    """A replica the balancer took out during the run (its health checks failed)."""

    replica: str
    status: str
    """The balancer's own word for it then (HAProxy ``DOWN``, ``MAINT``)."""
    down_s: float
    """When the balancer first reported it down, in seconds since the run's start."""
    after_requests: int
    """Requests the run had sent before that moment."""
    up_s: float | None = None
    """When it was reported back up; ``None``: still down when the run ended."""
    trouble_s: float | None = None
    """The first sign of trouble before ``down_s`` (connection or response errors the
    balancer counted against it), if it came earlier."""


@dataclass(frozen=True)
class ReplicaEvents:
    """What the balancer said about its replicas while the load ran (sampled a few times a
    second), and the errors it answered itself that this explains."""

    known: bool
    """Whether the balancer could say when a replica was down."""
    source: str = ""
    """Who said it (the balancer's registry name); empty when unknown."""
    reason: str = ""
    """Why it is not known (an external target, a balancer that cannot say)."""
    samples: int = 0
    outages: tuple[ReplicaOutage, ...] = ()
    unattributed: int = 0
    """Errors the balancer answered itself (5xx without a replica header, in the window)
    that could not be put on one replica."""
    unattributed_reason: str = ""


@dataclass(frozen=True)
class StageStats:
    index: int
    label: str
    start_s: float
    end_s: float
    users: int | None
    rate: float | None
    offered_load: float | None
    sent: int
    completed: int
    throughput_rps: float
    ttft_p99: float | None
    e2e_p99: float | None
    error_rate: float | None
    meets_slo: bool | None
    recovery_s: float | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SloCheck:
    name: str
    target: float
    value: float | None
    ok: bool | None
    detail: str = ""


@dataclass(frozen=True)
class ReplicaServerSide:
    """Server-side figures of one replica over the window (from Prometheus)."""

    replica: str
    running_avg: float | None = None
    running_max: float | None = None
    waiting_avg: float | None = None
    waiting_max: float | None = None
    kv_usage_avg: float | None = None
    kv_usage_max: float | None = None
    prefix_cache_hit_rate: float | None = None
    preemptions: float | None = None
    requests_finished: float | None = None
    server_ttft_p50: float | None = None
    server_ttft_p99: float | None = None
    gpu_util: float | None = None
    """DCGM_FI_DEV_GPU_UTIL averaged over the window, as a fraction."""
    busy_fraction: float | None = None
    """``gpu_util`` where exported, else the fraction of time with running requests."""
    sm_active: float | None = None
    """DCGM_FI_PROF_SM_ACTIVE averaged over the window (0..1): unlike ``gpu_util`` it does
    not saturate when a replica always has work, so it is what the balance prefers."""


@dataclass(frozen=True)
class BalancerServer:
    """One server (replica) as the balancer's own exporter counts it over the window."""

    server: str
    """The balancer's name for it: the replica's name."""
    sessions_avg: float | None = None
    """Requests open through the balancer to it, averaged over the window."""
    sessions_max: float | None = None
    responses: Mapping[str, float] = field(default_factory=dict)
    """Responses by HTTP code class (``"2xx"``, ``"5xx"``, ...) in the window."""


@dataclass(frozen=True)
class BalancerQueue:
    """One pool's queue in the balancer (requests waiting for a server)."""

    pool: str
    """The pool as the balancer names it (HAProxy backend, Envoy cluster: ``model_<model>``,
    ``all``)."""
    avg: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class BalancerSide:
    """The balancer's own figures over the window: what its exporter has of them (a
    balancer whose exporter has none leaves the lists empty)."""

    name: str
    """The balancer's registry name (``haproxy``, ``envoy``...)."""
    queues: tuple[BalancerQueue, ...] = ()
    servers: tuple[BalancerServer, ...] = ()


@dataclass(frozen=True)
class PromClientSide:
    """lbtune's own exporter, read back from Prometheus (for the cross-check)."""

    requests_by_outcome: Mapping[str, float] = field(default_factory=dict)
    requests_by_replica: Mapping[str, float] = field(default_factory=dict)
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    ttft_buckets: tuple[float, ...] = ()
    e2e_p50: float | None = None
    e2e_p99: float | None = None
    e2e_buckets: tuple[float, ...] = ()
    output_tokens: float | None = None


BalanceSource = Literal["sm_active", "gpu_util", "busy", "mixed"]
"""What ``ServerSide.replica_balance`` is the std-dev of."""


@dataclass(frozen=True)
class ServerSide:
    """Everything read from Prometheus over the window."""

    window: Window
    replicas: tuple[ReplicaServerSide, ...] = ()
    replica_balance: float | None = None
    """Population std-dev across replicas (0 = perfectly even) of ``sm_active`` where every
    replica has it, else of ``busy_fraction``."""
    balance_source: BalanceSource | None = None
    """What the balance is the std-dev of: ``sm_active``; or busy fractions from ``gpu_util``,
    the running-request fallback (``busy``) or both (``mixed``)."""
    prefix_cache_hit_rate: float | None = None
    balancer: BalancerSide | None = None
    """The balancer's own figures; ``None`` when the run did not know its balancer (a
    target URL given without its cluster)."""
    client: PromClientSide | None = None
    queries: Mapping[str, str] = field(default_factory=dict)
    """The PromQL behind every figure, by key (evaluated at ``window.end``)."""
    missing: tuple[str, ...] = ()
    """Keys of queries that failed or were never sent."""
    incomplete: bool = False
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CountCheck:
    outcome: str
    client: int
    prometheus: float | None
    tolerance: float
    agree: bool | None


@dataclass(frozen=True)
class QuantileCheck:
    name: str
    exact: float | None
    """The summary's own figure (``latency.ttft.p99`` for ``ttft_p99``)."""
    prometheus: float | None
    resolution: float | None
    """Width of the histogram bucket holding ``exact``."""
    agree: bool | None
    detail: str = ""
    low: float | None = None
    """Tolerance: ``prometheus`` agrees when it lies in ``[low, high]``."""
    high: float | None = None


@dataclass(frozen=True)
class CrossCheck:
    counts: tuple[CountCheck, ...] = ()
    quantiles: tuple[QuantileCheck, ...] = ()
    agree: bool | None = None
    """``False`` if any check disagrees, ``None`` if nothing could be compared."""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class GeneratorHealth:
    """Filled by the load generator; ``summarize`` fills lateness from records if absent."""

    lateness_p99_s: float | None = None
    loop_lag_p99_s: float | None = None
    cpu_max_percent: float | None = None
    processes: int = 1
    degraded: bool = False
    reasons: tuple[str, ...] = ()
    timing: str = ""
    """Response time stamps: ``kernel`` (arrival of the bytes), ``loop`` (TLS), ``mixed``."""
    ttft_bound_p50_s: float | None = None
    """How much the generator's time stamps could overstate TTFT P50 (its timing-error bound)."""
    ttft_bound_p99_s: float | None = None
    idle_share: float | None = None
    """Closed loop: share of the users' time spent idle between requests (starvation)."""


@dataclass(frozen=True)
class SessionStats:
    """Agent sessions whose first call was sent in the window (:mod:`lbtune.metrics.sessions`)."""

    started: int
    completed: int
    """Every planned call ended ``ok``."""
    failed: int
    """Some call ended in an error outcome."""
    unfinished: int
    """Neither: the run ended first (a call cut off, or never sent)."""
    completion: LatencyStats
    """First call sent to last call ended, over completed sessions."""
    in_cluster: LatencyStats
    """Union of the calls' send-to-end intervals (parallel calls counted once), over
    completed sessions."""
    waiting: LatencyStats
    """``completion`` less ``in_cluster`` per completed session: tool delays and turnaround."""
    in_cluster_share: float | None = None
    """Sum of ``in_cluster`` over sum of ``completion`` (completed sessions)."""
    calls_mean: float | None = None
    """Calls per completed session."""
    same_replica_share: float | None = None
    """Of the sessions' calls after their first, the share answered by the first call's
    replica: a client-side proxy for prefix-aware routing (the prefix cache's own hit
    rate is ``server.prefix_cache_hit_rate``)."""


@dataclass(frozen=True)
class RunSummary:
    scenario: str
    target: str
    run_start: float
    window: Window
    mode: Literal["open", "closed"]
    outcomes: Outcomes
    """Requests sent in the window."""
    all_outcomes: Outcomes
    """Every request of the run, warm-up and cool-down included."""
    throughput: Throughput
    latency: Latencies
    lateness: LatencyStats | None
    replicas: tuple[ReplicaStats, ...]
    generator: GeneratorHealth
    slo: Slo | None = None
    slo_checks: tuple[SloCheck, ...] = ()
    stages: tuple[StageStats, ...] = ()
    throughput_decay: float | None = None
    knee_stage: int | None = None
    knee_offered_load: float | None = None
    recovery_s: float | None = None
    recovered: bool | None = None
    """``None`` when the run had no spike stage."""
    server: ServerSide | None = None
    cross_check: CrossCheck | None = None
    replica_events: ReplicaEvents | None = None
    """``None``: not watched (a summary written before lbtune watched replicas)."""
    incomplete: bool = False
    notes: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION
    lbtune_version: str = ""
    sessions: SessionStats | None = None
    """Agent-session figures; ``None`` when the run's traffic was not agent sessions."""
