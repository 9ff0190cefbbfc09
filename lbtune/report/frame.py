"""Pure data for the report's tables and plots (the renderers only format it).

Tables are :class:`Table` values: column names and rows of cells (``str``,
numbers or ``None``). Latencies in tables and plots are in milliseconds, shares
and rates in percent where the column name says so. Time series use ``t`` in
seconds since the run start.

Time-series points (per-second latency percentiles) use the one percentile
(:func:`lbtune.records.quantiles.percentile`) *without* the sample-count rule of the
summary, so that a plot shows something at low rates; every point carries its sample
count ``n``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lbtune.metrics.summary import RunSummary
from lbtune.records.quantiles import LatencyStats

Cell = str | int | float | None


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def pct(fraction: float | None) -> float | None:
    return None if fraction is None else fraction * 100.0


BALANCE_NAME = "Replica balance (std-dev)"
"""The one name of ``server.replica_balance`` in every report (docs/metrics.md)."""


def load_unit(summary: RunSummary) -> str:
    """What offered load counts: users (closed loop) or arrivals per second (open loop)."""
    return "users" if summary.mode == "closed" else "req/s"


def warnings(summary: RunSummary) -> list[str]:
    """What must be read first: a degraded generator, an incomplete run, failed SLOs."""
    out: list[str] = []
    gen = summary.generator
    if gen.degraded:
        reasons = "; ".join(gen.reasons) or "no reason given"
        out.append(f"DEGRADED: the load generator fell behind ({reasons}); figures may be off.")
    if summary.incomplete:
        out.append("INCOMPLETE: some figures are missing (see the notes).")
    cc = summary.cross_check
    if cc is not None and cc.agree is False:
        what = [
            f"requests {c.outcome}: records {c.client}, Prometheus {c.prometheus:.0f} "
            f"(tolerance ±{c.tolerance:.1f})"
            for c in cc.counts
            if c.agree is False
        ] + [f"{q.name}: {q.detail}" for q in cc.quantiles if q.agree is False]
        out.append("CROSS-CHECK: records and Prometheus disagree: " + "; ".join(what) + ".")
    failed = [c.name for c in summary.slo_checks if c.ok is False]
    if failed:
        out.append("SLO NOT MET: " + ", ".join(failed) + ".")
    return out + replica_events(summary)


def replica_events(summary: RunSummary) -> list[str]:
    """Each replica the balancer took out during the run, and the balancer's own errors
    that could not be put on one replica (from ``summary.replica_events``)."""
    ev = summary.replica_events
    if ev is None:
        return []
    out = []
    for o in ev.outages:
        trouble = (
            f", first errors at t={o.trouble_s:.1f} s"
            if o.trouble_s is not None and o.trouble_s < o.down_s
            else ""
        )
        back = "still DOWN when the run ended"
        if o.up_s is not None:
            back = f"back UP at t={o.up_s:.1f} s"
        out.append(
            f"replica {o.replica} went {o.status.split()[0] if o.status else 'DOWN'} at "
            f"t={o.down_s:.1f} s (after {o.after_requests} requests{trouble}), {back}."
        )
    if ev.unattributed:
        out.append(
            f"unattributed: {ev.unattributed}, balancer answered itself ({ev.unattributed_reason})."
        )
    return out


def _ms_text(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


_SLO_NAMES = {"p99_ttft": "TTFT", "p99_e2e": "E2E", "error_rate": "errors"}


def slo_head(summary: RunSummary) -> str:
    """What the SLO checks say, naming what was not checked: "SLO met" only when TTFT, E2E
    and errors all were; else e.g. "SLO met for TTFT and errors; no E2E SLO set"."""
    checks = summary.slo_checks
    failed = [c.name for c in checks if c.ok is False]
    if failed:
        return f"SLO NOT met ({', '.join(failed)})"
    met = [_SLO_NAMES.get(c.name, c.name) for c in checks if c.ok]
    if not met:
        return "no SLO checked"
    named = {c.name for c in checks}
    unset = [_SLO_NAMES[k] for k in ("p99_ttft", "p99_e2e") if k not in named]
    if not unset:
        return "SLO met"
    return f"SLO met for {' and '.join(met)}; no {' or '.join(unset)} SLO set"


def verdict(summary: RunSummary) -> str:
    """One plain sentence on what the figures mean: SLO, served rate, first-token times."""
    s, lat = summary, summary.latency
    head = slo_head(s)
    out = [f"{s.throughput.requests_per_s:.1f} req/s served"]
    if lat.ttft is not None and lat.ttft.p50 is not None:
        first = f"half the requests had their first token within {_ms_text(lat.ttft.p50)}"
        if lat.ttft.p99 is not None:
            first += f", 99 % within {_ms_text(lat.ttft.p99)}"
        out.append(first)
    if lat.e2e is not None and lat.e2e.p99 is None:
        n = lat.e2e.count
        out.append(f"no P99 yet: {n} requests in the window, 100 needed (--until-samples 100)")
    errors = s.outcomes.error_rate
    if errors:
        out.append(f"{errors * 100:.1f} % of requests failed")
    if s.generator.degraded:
        out.append("the load generator fell behind, so latencies may read high (see the warning)")
    return f"Verdict: {head}. " + "; ".join(out) + "."


def headline(summary: RunSummary) -> Table:
    """The key figures of the measurement window."""
    lat, tput, outs = summary.latency, summary.throughput, summary.outcomes
    server = summary.server
    rows: list[tuple[Cell, ...]] = [
        ("Requests sent (window)", outs.sent, ""),
        ("Throughput", tput.requests_per_s, "req/s"),
        ("Output tokens", tput.output_tokens_per_s, "tok/s"),
        ("Goodput (SLO)", tput.goodput_per_s, "req/s"),
        ("TTFT P50", ms(lat.ttft.p50), "ms"),
        ("TTFT P99", ms(lat.ttft.p99), "ms"),
        ("E2E P50", ms(lat.e2e.p50), "ms"),
        ("E2E P99", ms(lat.e2e.p99), "ms"),
        ("ITL P50", ms(lat.itl.p50), "ms"),
        ("TPOT P50", ms(lat.tpot.p50), "ms"),
        ("Error rate", pct(outs.error_rate), "%"),
        ("Throughput decay", summary.throughput_decay, ""),
        ("Knee (offered load)", summary.knee_offered_load, load_unit(summary)),
        ("Recovery after spike", summary.recovery_s, "s"),
        (BALANCE_NAME, None if server is None else server.replica_balance, ""),
        (
            "Prefix-cache hit rate",
            None if server is None else pct(server.prefix_cache_hit_rate),
            "%",
        ),
    ]
    return Table(("Figure", "Value", "Unit"), tuple(rows))


def _lat_row(name: str, s: LatencyStats | None) -> tuple[Cell, ...]:
    if s is None:
        return (name, 0, None, None, None, None, None, None)
    return (
        name,
        s.count,
        *(ms(getattr(s, p)) for p in ("p50", "p90", "p95", "p99", "p999")),
        ms(s.max),
    )


def latency_table(summary: RunSummary) -> Table:
    lat = summary.latency
    rows = [
        _lat_row("TTFT", lat.ttft),
        _lat_row("ITL", lat.itl),
        _lat_row("TPOT", lat.tpot),
        _lat_row("E2E", lat.e2e),
    ]
    if lat.ttft_from_schedule is not None:
        rows.append(_lat_row("TTFT from schedule", lat.ttft_from_schedule))
    if lat.e2e_from_schedule is not None:
        rows.append(_lat_row("E2E from schedule", lat.e2e_from_schedule))
    if summary.lateness is not None:
        rows.append(_lat_row("Send lateness", summary.lateness))
    cols = ("Latency (ms)", "n", "P50", "P90", "P95", "P99", "P99.9", "max")
    return Table(cols, tuple(rows))


def outcome_table(summary: RunSummary) -> Table:
    outs = summary.outcomes
    rows = tuple(
        (name, count, pct(outs.rates.get(name)) if outs.sent else None)
        for name, count in outs.counts.items()
    )
    return Table(
        ("Outcome", "Requests", "Share (%)"),
        (*rows, ("sent", outs.sent, 100.0 if outs.sent else None)),
    )


def replica_table(summary: RunSummary) -> Table:
    server = {r.replica: r for r in summary.server.replicas} if summary.server else {}
    rows = []
    for r in summary.replicas:
        s = server.get(r.replica)
        rows.append(
            (
                r.replica,
                r.sent,
                pct(r.share),
                r.errors,
                r.balancer_errors,
                ms(r.ttft_p50),
                ms(r.ttft_p99),
                ms(r.e2e_p50),
                ms(r.e2e_p99),
                None if s is None else pct(s.busy_fraction),
                None if s is None else pct(s.kv_usage_avg),
                None if s is None else s.waiting_avg,
            )
        )
    cols = (
        "Replica",
        "Sent",
        "Share (%)",
        "Errors",
        "By balancer",
        "TTFT P50 (ms)",
        "TTFT P99 (ms)",
        "E2E P50 (ms)",
        "E2E P99 (ms)",
        "Busy (%)",
        "KV avg (%)",
        "Waiting avg",
    )
    return Table(cols, tuple(rows))


def server_table(summary: RunSummary) -> Table:
    rows = []
    for r in summary.server.replicas if summary.server else ():
        rows.append(
            (
                r.replica,
                r.running_avg,
                r.running_max,
                r.waiting_avg,
                r.waiting_max,
                pct(r.kv_usage_avg),
                pct(r.kv_usage_max),
                pct(r.prefix_cache_hit_rate),
                r.preemptions,
                ms(r.server_ttft_p50),
                ms(r.server_ttft_p99),
                pct(r.gpu_util),
                pct(r.sm_active),
            )
        )
    cols = (
        "Replica",
        "Running avg",
        "Running max",
        "Waiting avg",
        "Waiting max",
        "KV avg (%)",
        "KV max (%)",
        "Prefix hit (%)",
        "Preemptions",
        "Server TTFT P50 (ms)",
        "Server TTFT P99 (ms)",
        "GPU util (%)",
        "SM active (%)",
    )
    return Table(cols, tuple(rows))


def stage_table(summary: RunSummary) -> Table:
    rows = tuple(
        (
            s.index,
            s.label,
            s.start_s,
            s.end_s,
            s.offered_load,
            s.sent,
            s.throughput_rps,
            ms(s.ttft_p99),
            ms(s.e2e_p99),
            pct(s.error_rate),
            None if s.meets_slo is None else ("yes" if s.meets_slo else "no"),
            s.recovery_s,
        )
        for s in summary.stages
    )
    cols = (
        "#",
        "Stage",
        "Start (s)",
        "End (s)",
        f"Offered load ({load_unit(summary)})",
        "Sent",
        "Throughput (req/s)",
        "TTFT P99 (ms)",
        "E2E P99 (ms)",
        "Errors (%)",
        "Meets SLO",
        "Recovery (s)",
    )
    return Table(cols, rows)


SESSION_NOTE = (
    "Sessions whose first call was sent in the window; times over completed sessions."
    " In the cluster: the union of the calls' send-to-end intervals (parallel subagent"
    " calls counted once); waiting: the rest (tool delays). Same replica: the share of"
    " calls after a session's first answered by the first call's replica, a client-side"
    " proxy for prefix-aware routing, not the prefix cache's hit rate."
)
"""What the agent-session table's figures are (under it, in both reports)."""


def session_table(summary: RunSummary) -> Table:
    """The agent sessions whose first call was sent in the window (``summary.sessions``);
    no rows when the run's traffic was not agent sessions."""
    ss = summary.sessions
    if ss is None:
        return Table(("Figure", "Value", "Unit"), ())
    rows: tuple[tuple[Cell, ...], ...] = (
        ("Sessions started (window)", ss.started, ""),
        ("Completed", ss.completed, ""),
        ("Failed", ss.failed, ""),
        ("Unfinished (run ended first)", ss.unfinished, ""),
        ("Completion time P50", ms(ss.completion.p50), "ms"),
        ("Completion time P90", ms(ss.completion.p90), "ms"),
        ("Completion time P99", ms(ss.completion.p99), "ms"),
        ("In the cluster P50", ms(ss.in_cluster.p50), "ms"),
        ("Waiting P50", ms(ss.waiting.p50), "ms"),
        ("Time in the cluster", pct(ss.in_cluster_share), "%"),
        ("Calls per session", ss.calls_mean, "calls"),
        ("Same replica as first call", pct(ss.same_replica_share), "%"),
    )
    return Table(("Figure", "Value", "Unit"), rows)


def slo_table(summary: RunSummary) -> Table:
    def shown(name: str, v: float | None) -> float | None:
        return pct(v) if name == "error_rate" else ms(v)

    rows = tuple(
        (
            c.name,
            shown(c.name, c.target),
            shown(c.name, c.value),
            "n/a" if c.ok is None else ("pass" if c.ok else "FAIL"),
            c.detail,
        )
        for c in summary.slo_checks
    )
    return Table(("Check", "Target (ms or %)", "Value (ms or %)", "Result", "Detail"), rows)


def crosscheck_table(summary: RunSummary) -> Table:
    cc = summary.cross_check
    rows: list[tuple[Cell, ...]] = []
    if cc is not None:
        for c in cc.counts:
            verdict = "n/a" if c.agree is None else ("agree" if c.agree else "DISAGREE")
            rows.append(
                (f"requests {c.outcome}", c.client, c.prometheus, f"±{c.tolerance:.1f}", verdict)
            )
        for q in cc.quantiles:
            verdict = "n/a" if q.agree is None else ("agree" if q.agree else "DISAGREE")
            tol: str | None = None
            if q.low is not None and q.high is not None:
                tol = f"{q.low * 1000:.1f} to {q.high * 1000:.1f} ms"
            exact = q.exact
            if exact is None:  # not compared (too few samples): still show the summary's figure
                exact, tol = _summary_quantile(summary, q.name), q.detail
            rows.append((f"{q.name} (ms)", ms(exact), ms(q.prometheus), tol, verdict))
    return Table(("Figure", "Records", "Prometheus", "Tolerance", "Verdict"), tuple(rows))


def _summary_quantile(summary: RunSummary, name: str) -> float | None:
    """``ttft_p50`` -> ``summary.latency.ttft.p50`` (None for a name it does not have)."""
    metric, _, key = name.rpartition("_")
    stats = getattr(summary.latency, metric, None)
    value = getattr(stats, key, None) if stats is not None else None
    return value if isinstance(value, float) else None
