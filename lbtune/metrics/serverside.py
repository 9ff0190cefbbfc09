"""Collect the server side (vLLM, GPUs, the balancer) and lbtune's exporter over a window.

:func:`collect` sends the queries of :func:`lbtune.metrics.promql.server_side_queries`
one by one at the window's end; the balancer's own series are the ones its registry entry
names (:class:`~lbtune.metrics.promql.BalancerSeries`, handed in by the caller). A query
that fails is recorded as missing and the collection goes on; when Prometheus stops
answering, the collection stops, keeps what it has and marks the result incomplete — a
report is still written.

Call it at least one scrape interval after the window's end, so that the last
samples of the window have been scraped.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from lbtune.errors import TargetError
from lbtune.metrics import promql
from lbtune.metrics.prom import PrometheusUnreachable, Querier, Sample
from lbtune.metrics.promql import BalancerSeries
from lbtune.metrics.summary import (
    BalancerQueue,
    BalancerServer,
    BalancerSide,
    BalanceSource,
    PromClientSide,
    ReplicaServerSide,
    ServerSide,
    Window,
)

log = logging.getLogger(__name__)

Results = Mapping[str, list[Sample]]

_REPLICA_FIELDS = (
    "running_avg",
    "running_max",
    "waiting_avg",
    "waiting_max",
    "kv_usage_avg",
    "kv_usage_max",
    "prefix_cache_hit_rate",
    "preemptions",
    "requests_finished",
    "server_ttft_p50",
    "server_ttft_p99",
)


@dataclass(frozen=True)
class Answers:
    """What Prometheus answered to one collection's queries."""

    results: Results
    """Key -> the samples of its query (keys that failed are absent)."""
    queries: Mapping[str, str]
    """Key -> PromQL, every query of the collection."""
    missing: tuple[str, ...] = ()
    incomplete: bool = False
    notes: tuple[str, ...] = ()


def collect(
    prom: Querier,
    window: Window,
    *,
    job: str = "lbtune",
    scrape_interval_s: float = 1.0,
    balancer: BalancerSeries | None = None,
) -> ServerSide:
    """Every server-side figure over ``window``; tolerates Prometheus dying mid-way.
    ``balancer``: which of the balancer's own series to read (``None``: the balancer is
    unknown, its section stays out)."""
    queries = promql.server_side_queries(
        window.duration, job=job, step_s=scrape_interval_s, balancer=balancer
    )
    answers = ask(prom, queries, window.end)
    if answers.results:  # it answered: are its series still being scraped?
        stale = frozen(prom, window.end, max(STALE_AFTER_S, 5 * scrape_interval_s))
        if stale is not None:
            log.warning("%s", stale)
            answers = replace(answers, incomplete=True, notes=(*answers.notes, stale))
    return assemble(answers, window, balancer)


STALE_AFTER_S = 60.0
"""Prometheus's newest sample older than this at a window's end (or five scrape intervals,
the longer): its scrapes stopped, and the window's rates would read as zeros. A minute:
above any sane scrape interval (callers do not always know it), below a run's length."""
NEWEST_SAMPLE = "max(timestamp(up))"


def frozen(prom: Querier, at: float, stale_after_s: float) -> str | None:
    """A note when Prometheus answers but its newest scrape is older than ``stale_after_s``
    at ``at`` (a frozen scrape loop: the figures would be zeros, not measurements);
    ``None`` when it is fresh or cannot tell (no answer: :func:`ask` says so already)."""
    try:
        newest = [x.value for x in prom.query(NEWEST_SAMPLE, at=at) if x.value is not None]
    except TargetError:
        return None
    if not newest:
        return None
    age = at - max(newest)
    if age <= stale_after_s:
        return None
    return (
        f"Prometheus answers but its newest sample is {age:.0f} s older than the window's "
        "end: its scrapes stopped (frozen?); server-side figures are not measurements"
    )


def ask(prom: Querier, queries: Mapping[str, str], at: float) -> Answers:
    """Send ``queries`` one by one, evaluated at ``at``: a query that fails is missing and
    the others go on; once Prometheus stops answering, the rest are missing."""
    results: dict[str, list[Sample]] = {}
    missing: list[str] = []
    notes: list[str] = []
    incomplete = False
    began = time.monotonic()
    keys = list(queries)
    for i, key in enumerate(keys):
        try:
            results[key] = prom.query(queries[key], at=at)
        except PrometheusUnreachable as exc:
            missing.extend(keys[i:])
            incomplete = True
            elapsed = time.monotonic() - began
            notes.append(
                f"Prometheus unreachable after {elapsed:.0f} s ({i} of {len(keys)} queries "
                f"answered): server-side figures missing ({exc})"
            )
            log.warning("%s", notes[-1])
            break
        except TargetError as exc:
            missing.append(key)
            incomplete = True
            notes.append(f"query {key!r} failed: {exc}")
            log.warning("%s", notes[-1])
    return Answers(results, dict(queries), tuple(missing), incomplete, tuple(notes))


def assemble(
    answers: Answers, window: Window, balancer: BalancerSeries | None = None
) -> ServerSide:
    """Turn raw query results into a :class:`ServerSide` (pure)."""
    results = answers.results
    by_replica = {key: _by_label(results.get(key, []), promql.REPLICA) for key in results}
    names: set[str] = set()
    for key in (*_REPLICA_FIELDS, "gpu_util", "sm_active", "busy_fraction"):
        names.update(by_replica.get(key, {}))
    all_notes = list(answers.notes)
    replicas = []
    for name in sorted(names):
        figures = {k: by_replica.get(k, {}).get(name) for k in _REPLICA_FIELDS}
        gpu_pct = by_replica.get("gpu_util", {}).get(name)
        gpu = None if gpu_pct is None else gpu_pct / 100.0
        busy = gpu if gpu is not None else by_replica.get("busy_fraction", {}).get(name)
        sm = by_replica.get("sm_active", {}).get(name)
        replicas.append(
            ReplicaServerSide(
                replica=name, gpu_util=gpu, busy_fraction=busy, sm_active=sm, **figures
            )
        )
    balance, source, balance_notes = _balance(replicas, results)
    all_notes.extend(balance_notes)
    hit_all = results.get("prefix_cache_hit_rate_all", [])
    return ServerSide(
        window=window,
        replicas=tuple(replicas),
        replica_balance=balance,
        balance_source=source,
        prefix_cache_hit_rate=hit_all[0].value if hit_all else None,
        balancer=None if balancer is None else _balancer(results, balancer),
        client=_client(results),
        queries=dict(answers.queries),
        missing=answers.missing,
        incomplete=answers.incomplete,
        notes=tuple(all_notes),
    )


def _balance(
    replicas: list[ReplicaServerSide], results: Results
) -> tuple[float | None, BalanceSource | None, list[str]]:
    """Replica balance, what it is the std-dev of, and notes on why it fell back.

    SM activity where every replica with a figure has it (it tells a replica with one
    request from one with 200, where GPU utilisation reads 1 for both); else busy fractions.
    Population std-dev (ddof 0), over at least two replicas.
    """
    notes: list[str] = []
    sm = [r.sm_active for r in replicas if r.sm_active is not None]
    with_busy = [r for r in replicas if r.busy_fraction is not None]
    without_sm = [r.replica for r in with_busy if r.sm_active is None]
    if len(sm) >= 2 and not without_sm:
        return statistics.pstdev(sm), "sm_active", notes
    if sm and without_sm:
        notes.append(
            f"no {promql.DCGM_SM_ACTIVE} for {', '.join(without_sm)}: replica balance from "
            "busy fractions on every replica"
        )
    elif replicas and "sm_active" in results and not results["sm_active"]:
        notes.append(
            f"no {promql.DCGM_SM_ACTIVE} series (DCGM profiling metrics): replica balance from "
            "busy fractions, which read 1 on every replica that always has work"
        )
    if replicas and "gpu_util" in results and not results["gpu_util"]:
        notes.append(
            f"no {promql.DCGM_GPU_UTIL} series: busy fractions from the fraction of time "
            "with running requests"
        )
    busy = [r.busy_fraction for r in with_busy if r.busy_fraction is not None]
    balance = statistics.pstdev(busy) if len(busy) >= 2 else None
    kinds = {"gpu_util" if r.gpu_util is not None else "busy" for r in with_busy}
    source: BalanceSource | None = None
    if len(kinds) == 1:
        source = "gpu_util" if kinds == {"gpu_util"} else "busy"
    elif kinds:
        source = "mixed"
    return balance, source, notes


def _by_label(samples: list[Sample], label: str) -> dict[str, float | None]:
    return {s.labels[label]: s.value for s in samples if label in s.labels}


def _single(results: Results, key: str) -> float | None:
    samples = results.get(key, [])
    return samples[0].value if samples else None


def _balancer(results: Results, series: BalancerSeries) -> BalancerSide:
    """The balancer's section: its queue per pool, its open requests and responses per
    server (server label values renamed to replicas by ``series.server_names``)."""
    avg = _by_label(results.get("balancer_queue_avg", []), series.pool_label)
    mx = _by_label(results.get("balancer_queue_max", []), series.pool_label)
    queues = tuple(
        BalancerQueue(pool=p, avg=avg.get(p), max=mx.get(p)) for p in sorted(set(avg) | set(mx))
    )
    label, names = series.server_label, series.server_names
    s_avg = _renamed(_by_label(results.get("balancer_sessions_avg", []), label), names)
    s_max = _renamed(_by_label(results.get("balancer_sessions_max", []), label), names)
    responses: dict[str, dict[str, float]] = {}
    for s in results.get("balancer_responses", []):
        server, code = s.labels.get(label), s.labels.get(series.code_label)
        if server is not None and code is not None and s.value is not None:
            responses.setdefault(names.get(server, server), {})[code] = s.value
    servers = tuple(
        BalancerServer(
            server=n,
            sessions_avg=s_avg.get(n),
            sessions_max=s_max.get(n),
            responses=dict(sorted(responses.get(n, {}).items())),
        )
        for n in sorted(set(s_avg) | set(s_max) | set(responses))
    )
    return BalancerSide(name=series.balancer, queues=queues, servers=servers)


def _renamed(values: dict[str, float | None], names: Mapping[str, str]) -> dict[str, float | None]:
    return {names.get(k, k): v for k, v in values.items()}


def _bounds(samples: list[Sample]) -> tuple[float, ...]:
    """The finite ``le`` bounds of a histogram (``+Inf`` carries no resolution)."""
    out = set()
    for s in samples:
        try:
            le = float(s.labels.get("le", "nan"))
        except ValueError:
            continue
        if math.isfinite(le):
            out.add(le)
    return tuple(sorted(out))


def _client(results: Results) -> PromClientSide | None:
    if not any(k.startswith("client_") for k in results):
        return None

    def counts(key: str, label: str) -> dict[str, float]:
        return {k: v for k, v in _by_label(results.get(key, []), label).items() if v is not None}

    return PromClientSide(
        requests_by_outcome=counts("client_requests_by_outcome", "outcome"),
        requests_by_replica=counts("client_requests_by_replica", promql.REPLICA),
        ttft_p50=_single(results, "client_ttft_p50"),
        ttft_p99=_single(results, "client_ttft_p99"),
        ttft_buckets=_bounds(results.get("client_ttft_buckets", [])),
        e2e_p50=_single(results, "client_e2e_p50"),
        e2e_p99=_single(results, "client_e2e_p99"),
        e2e_buckets=_bounds(results.get("client_e2e_buckets", [])),
        output_tokens=_single(results, "client_output_tokens"),
    )
