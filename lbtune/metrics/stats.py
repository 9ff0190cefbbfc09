"""Exact run statistics from per-request records (pure; numpy only).

Which records count (see ``docs/metrics.md`` for every definition):

* Latency figures (TTFT, ITL, TPOT, E2E, lateness), outcomes, error rate and the
  per-replica figures use requests *sent* in the measurement window
  ``[start, end)`` — warm-up and cool-down excluded. Latencies use successful
  (``ok``) requests only; the outcome counts use all of them.
* Throughput and goodput use successful requests that *ended* in the window,
  divided by the window's duration.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from lbtune import __version__
from lbtune.metrics import replica_events
from lbtune.metrics import stages as stage_figures
from lbtune.metrics.crosscheck import cross_check
from lbtune.metrics.replica_events import ReplicaTimeline, balancer_made, owners
from lbtune.metrics.sessions import session_stats
from lbtune.metrics.summary import (
    GeneratorHealth,
    Latencies,
    Outcomes,
    ReplicaStats,
    RunSummary,
    ServerSide,
    SloCheck,
    StageStats,
    Throughput,
    Window,
)
from lbtune.records.quantiles import LatencyStats, latency_stats, p99_or_max, reported_percentile
from lbtune.records.requests import ERROR_OUTCOMES, OUTCOMES, RequestRecord
from lbtune.records.slo import Slo

if TYPE_CHECKING:
    import pandas as pd

UNKNOWN_REPLICA = "unknown"


def sent_in(records: Iterable[RequestRecord], window: Window) -> list[RequestRecord]:
    """Requests whose actual send time falls in ``[window.start, window.end)``."""
    return [r for r in records if window.contains(r.sent_at)]


def ended_in(records: Iterable[RequestRecord], window: Window) -> list[RequestRecord]:
    """Requests whose end falls in ``[window.start, window.end)``."""
    return [r for r in records if window.contains(r.ended_at)]


def outcomes(records: Sequence[RequestRecord]) -> Outcomes:
    """Counts by outcome (every known outcome listed, zeros included) and error rate."""
    counts: Counter[str] = Counter({o: 0 for o in OUTCOMES})
    counts.update(r.outcome for r in records)
    sent = len(records)
    judged = sent - counts["cancelled"]  # cut off by the test's end: no verdict
    return Outcomes(
        sent=sent,
        counts=dict(counts),
        error_rate=(judged - counts["ok"]) / judged if judged else None,
        rates={o: c / sent for o, c in counts.items()} if sent else {},
    )


def latencies(records: Sequence[RequestRecord]) -> Latencies:
    """TTFT, ITL, TPOT, E2E over the successful requests among ``records``."""
    ok = [r for r in records if r.outcome == "ok"]
    scheduled = [r for r in ok if r.scheduled_at is not None]
    return Latencies(
        ttft=latency_stats(t for r in ok if (t := r.ttft) is not None),
        itl=latency_stats(g for r in ok for g in r.itls),
        tpot=latency_stats(t for r in ok if (t := r.tpot) is not None),
        e2e=latency_stats(r.e2e for r in ok),
        ttft_from_schedule=latency_stats(
            r.first_token_at - r.scheduled_at
            for r in scheduled
            if r.first_token_at is not None and r.scheduled_at is not None
        )
        if scheduled
        else None,
        e2e_from_schedule=latency_stats(
            r.ended_at - r.scheduled_at for r in scheduled if r.scheduled_at is not None
        )
        if scheduled
        else None,
    )


def lateness(records: Sequence[RequestRecord]) -> LatencyStats | None:
    """Send time minus scheduled time (open loop); ``None`` in closed loop."""
    values = [x for r in records if (x := r.lateness) is not None]
    return latency_stats(values) if values else None


def meets_slo(r: RequestRecord, slo: Slo) -> bool:
    """A successful request within the TTFT, TPOT and E2E bounds of the SLO.

    A request without a TPOT (not streamed, or fewer than two output tokens) is not judged
    on TPOT: its E2E bound covers it."""
    if r.outcome != "ok":
        return False
    if slo.ttft_s is not None and stage_figures.slo_ttft(r) > slo.ttft_s:
        return False
    tpot = r.tpot
    if slo.tpot_s is not None and tpot is not None and tpot > slo.tpot_s:
        return False
    return slo.e2e_s is None or r.e2e <= slo.e2e_s


def throughput(records: Sequence[RequestRecord], window: Window, slo: Slo | None) -> Throughput:
    """Completed requests/s, output tokens/s and goodput over the window."""
    dur = window.duration
    done = [r for r in ended_in(records, window) if r.outcome == "ok"]
    tokens = sum(r.output_tokens or 0 for r in done)
    sent = len(sent_in(records, window))
    good: int | None = None
    if slo is not None and (slo.ttft_s is not None or slo.e2e_s is not None):
        good = sum(1 for r in done if meets_slo(r, slo))

    def per_s(n: float) -> float:
        return n / dur if dur > 0 else 0.0

    return Throughput(
        completed=len(done),
        requests_per_s=per_s(len(done)),
        output_tokens=tokens,
        output_tokens_per_s=per_s(tokens),
        sent_per_s=per_s(sent),
        goodput_requests=good,
        goodput_per_s=None if good is None else per_s(good),
    )


def cancelled(records: Sequence[RequestRecord]) -> int:
    return sum(1 for r in records if r.outcome == "cancelled")


def replica_stats(
    records: Sequence[RequestRecord], timeline: ReplicaTimeline | None = None
) -> tuple[ReplicaStats, ...]:
    """Share, errors and TTFT/E2E P50/P99 per replica (``unknown`` if no header). With a
    ``timeline``, an error the balancer answered itself counts against the replica that
    was down then (:func:`lbtune.metrics.replica_events.owners`)."""
    groups: dict[str, list[RequestRecord]] = {}
    owned, _ = owners(records, timeline)
    for r, owner in zip(records, owned, strict=True):
        groups.setdefault(owner or UNKNOWN_REPLICA, []).append(r)
    total = len(records)
    out = []
    for name in sorted(groups):
        group = groups[name]
        ok = [r for r in group if r.outcome == "ok"]
        ttfts = [t for r in ok if (t := r.ttft) is not None]
        e2es = [r.e2e for r in ok]
        errors = Counter(r.outcome for r in group if r.outcome in ERROR_OUTCOMES)
        figures = {
            "ttft_p50": reported_percentile(ttfts, "p50"),
            "ttft_p99": reported_percentile(ttfts, "p99"),
            "e2e_p50": reported_percentile(e2es, "p50"),
            "e2e_p99": reported_percentile(e2es, "p99"),
        }
        out.append(
            ReplicaStats(
                replica=name,
                sent=len(group),
                share=len(group) / total,
                ok=len(ok),
                errors=sum(errors.values()),
                error_rate=sum(errors.values()) / judged
                if (judged := len(group) - cancelled(group))
                else None,
                errors_by_outcome=dict(sorted(errors.items())),
                too_few_samples=tuple(k for k, v in figures.items() if v is None),
                balancer_errors=sum(1 for r in group if r.replica is None and balancer_made(r))
                if name != UNKNOWN_REPLICA
                else 0,
                **figures,
            )
        )
    return tuple(out)


def slo_checks(
    ok_records: Sequence[RequestRecord], outs: Outcomes, slo: Slo
) -> tuple[SloCheck, ...]:
    """P99 TTFT, P99 E2E (over ``ok_records``) and the error rate against the SLO.

    The P99s are the latency table's (:func:`latencies`): TTFT over the streamed
    requests, E2E over all; below 100 samples the maximum is judged instead.
    """
    checks: list[SloCheck] = []
    for name, target, values in (
        ("p99_ttft", slo.ttft_s, [t for r in ok_records if (t := r.ttft) is not None]),
        ("p99_e2e", slo.e2e_s, [r.e2e for r in ok_records]),
    ):
        if target is None:
            continue
        value, exact = p99_or_max(values)
        detail = ""
        if value is not None and not exact:
            detail = f"fewer than 100 samples ({len(values)}): judged on the maximum"
        if value is None and ok_records and name == "p99_ttft":
            detail = "no streamed request in the window: TTFT is undefined"
        ok = None if value is None else value <= target
        checks.append(SloCheck(name=name, target=target, value=value, ok=ok, detail=detail))
    rate = outs.error_rate
    checks.append(
        SloCheck(
            name="error_rate",
            target=slo.max_error_rate,
            value=rate,
            ok=None if rate is None else rate <= slo.max_error_rate,
        )
    )
    return tuple(checks)


def _with_lateness(gen: GeneratorHealth, late: LatencyStats | None) -> GeneratorHealth:
    """The generator's health, with the records' lateness P99 where the sampler had none."""
    if gen.lateness_p99_s is None and late is not None and late.p99 is not None:
        return dataclasses.replace(gen, lateness_p99_s=late.p99)
    return gen


def _run_notes(
    notes: Sequence[str],
    any_in_window: bool,
    recovered: bool | None,
    stage_stats: Sequence[StageStats],
    server: ServerSide | None,
) -> tuple[str, ...]:
    """The caller's notes, then what the figures themselves could not say, then the server's."""
    out = list(notes)
    if not any_in_window:
        out.append("no request was sent in the measurement window")
    if recovered is None and any(s.label == stage_figures.SPIKE_LABEL for s in stage_stats):
        out.append("spike stage without a TTFT SLO: recovery time not computed")
    if server is not None:
        out.extend(server.notes)
    return tuple(out)


def summarize(
    records: Sequence[RequestRecord],
    *,
    run_start: float,
    window: Window,
    scenario: str,
    target: str,
    slo: Slo | None = None,
    stages: Sequence[stage_figures.Stage] = (),
    server: ServerSide | None = None,
    generator: GeneratorHealth | None = None,
    incomplete: bool = False,
    notes: Sequence[str] = (),
    scrape_interval_s: float = 1.0,
    stage_settle_s: float = 0.0,
    recovery_window_s: float = 2.0,
    recovery_step_s: float = 0.25,
    replicas: ReplicaTimeline | None = None,
    session_calls: Mapping[int, int] | None = None,
) -> RunSummary:
    """Every client-side figure of a run, plus the server side and the cross-check if given.

    ``session_calls`` (agent-session traffic: session id -> calls its plan holds) adds the
    session figures (:func:`lbtune.metrics.sessions.session_stats`)."""
    in_window = sent_in(records, window)
    ok = [r for r in in_window if r.outcome == "ok"]
    lat = latencies(in_window)
    outs = outcomes(in_window)
    late = lateness(in_window)
    stage_stats = stage_figures.stage_stats(
        records,
        stages,
        run_start=run_start,
        slo=slo,
        settle_s=stage_settle_s,
        recovery_window_s=recovery_window_s,
        recovery_step_s=recovery_step_s,
    )
    knee = stage_figures.knee(stage_stats)
    recovery_s, recovered = _spike_recovery(stage_stats, slo)
    cross = None
    if server is not None and server.client is not None:
        cross = cross_check(
            records, window, server.client, latency=lat, scrape_interval_s=scrape_interval_s
        )
    return RunSummary(
        scenario=scenario,
        target=target,
        run_start=run_start,
        window=window,
        mode="open" if any(r.scheduled_at is not None for r in records) else "closed",
        outcomes=outs,
        all_outcomes=outcomes(records),
        throughput=throughput(records, window, slo),
        latency=lat,
        lateness=late,
        replicas=replica_stats(in_window, replicas),
        replica_events=replica_events.events(replicas, records, in_window, run_start),
        generator=_with_lateness(generator or GeneratorHealth(), late),
        slo=slo,
        slo_checks=slo_checks(ok, outs, slo) if slo is not None else (),
        stages=stage_stats,
        throughput_decay=stage_figures.throughput_decay(stage_stats),
        knee_stage=None if knee is None else knee.index,
        knee_offered_load=None if knee is None else knee.offered_load,
        recovery_s=recovery_s,
        recovered=recovered,
        server=server,
        cross_check=cross,
        incomplete=incomplete or (server is not None and server.incomplete),
        notes=_run_notes(notes, bool(in_window), recovered, stage_stats, server),
        lbtune_version=__version__,
        sessions=None if session_calls is None else session_stats(records, window, session_calls),
    )


def _spike_recovery(
    stage_stats: Sequence[StageStats], slo: Slo | None
) -> tuple[float | None, bool | None]:
    """(the longest recovery of the spike stages, whether every one recovered).

    ``(None, None)`` without spike stages or without a TTFT SLO to recover to; the time
    is ``None`` too when a spike never recovered.
    """
    spikes = [s for s in stage_stats if s.label == stage_figures.SPIKE_LABEL]
    if not spikes or slo is None or slo.ttft_s is None:
        return None, None
    recoveries = [s.recovery_s for s in spikes]
    if None in recoveries:
        return None, False
    return max(r for r in recoveries if r is not None), True


def records_to_frame(records: Iterable[RequestRecord]) -> pd.DataFrame:
    """One row per record with the derived ttft, e2e, tpot, lateness and chunk count."""
    import pandas as pd

    rows = []
    for r in records:
        rows.append(
            {
                "request_id": r.request_id,
                "index": r.index,
                "model": r.model,
                "api": r.api,
                "stream": r.stream,
                "outcome": r.outcome,
                "status_code": r.status_code,
                "replica": r.replica,
                "scheduled_at": r.scheduled_at,
                "sent_at": r.sent_at,
                "headers_at": r.headers_at,
                "first_token_at": r.first_token_at,
                "ended_at": r.ended_at,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "chunks": len(r.chunk_times),
                "ttft": r.ttft,
                "e2e": r.e2e,
                "tpot": r.tpot,
                "lateness": r.lateness,
                "priority": r.priority,
                "prefix_group": r.prefix_group,
                "session_id": r.session_id,
                "worker": r.worker,
                "error": r.error,
            }
        )
    return pd.DataFrame(rows)
