"""``report.md``: the summary as GitHub-flavoured Markdown, warnings first."""

from __future__ import annotations

import datetime as dt

from lbtune.metrics.summary import RunSummary
from lbtune.report import frame
from lbtune.report.frame import Cell, Table


def fmt(value: Cell) -> str:
    """A cell as text: ``–`` for missing, numbers rounded to what a reader needs."""
    if value is None:
        return "–"
    if isinstance(value, bool | int | str):
        return str(value)
    v = float(value)
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def numeric(t: Table, col: int) -> bool:
    """A column of numbers (right-aligned); the first column is always a label."""
    cells = [row[col] for row in t.rows if row[col] is not None]
    return col > 0 and all(isinstance(c, int | float) and not isinstance(c, bool) for c in cells)


def table(t: Table) -> str:
    if not t.rows:
        return "_none_\n"
    lines = [
        "| " + " | ".join(t.columns) + " |",
        "|" + "|".join("---:" if numeric(t, i) else "---" for i in range(len(t.columns))) + "|",
    ]
    for row in t.rows:
        lines.append("| " + " | ".join(fmt(c).replace("|", "\\|") for c in row) + " |")
    return "\n".join(lines) + "\n"


def when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render(summary: RunSummary) -> str:
    s = summary
    parts = [f"# lbtune report: {s.scenario}\n\n"]
    warnings = frame.warnings(s)
    if warnings:
        parts.append("\n>\n".join(f"> **⚠ {w}**" for w in warnings) + "\n\n")
    parts.append(f"**{frame.verdict(s)}**\n\n")
    gen = s.generator
    parts.append(
        f"- Target: `{s.target}`\n"
        f"- Started: {when(s.run_start)}; measurement window {s.window.start - s.run_start:.1f} s"
        f" to {s.window.end - s.run_start:.1f} s ({s.window.duration:.1f} s), {s.mode} loop\n"
        f"- Generator: {gen.processes} process(es),"
        f" lateness P99 {fmt(frame.ms(gen.lateness_p99_s))} ms,"
        f" loop lag P99 {fmt(frame.ms(gen.loop_lag_p99_s))} ms,"
        f" CPU max {fmt(gen.cpu_max_percent)} %; {gen.timing or 'no'} time stamps,"
        f" TTFT error bound P50 {fmt(frame.ms(gen.ttft_bound_p50_s))} /"
        f" P99 {fmt(frame.ms(gen.ttft_bound_p99_s))} ms\n"
        f"- lbtune {s.lbtune_version}, summary schema {s.schema_version}\n\n"
    )
    parts.append("## Summary\n\n" + table(frame.headline(s)) + "\n")
    if s.slo is not None:
        parts.append("## SLO checks\n\n" + table(frame.slo_table(s)) + "\n")
    parts.append("## Latency\n\n" + table(frame.latency_table(s)) + "\n")
    parts.append(
        "Percentiles need at least 2 (P50), 10 (P90), 20 (P95), 100 (P99) and 1000 (P99.9)"
        " samples; `–` marks too few.\n\n"
    )
    parts.append(
        "## Outcomes (requests sent in the window)\n\n" + table(frame.outcome_table(s)) + "\n"
    )
    parts.append("## Per replica\n\n" + table(frame.replica_table(s)) + "\n")
    if s.stages:
        parts.append("## Stages\n\n" + table(frame.stage_table(s)) + "\n")
    if s.sessions is not None:
        parts.append("## Agent sessions\n\n" + table(frame.session_table(s)) + "\n")
        parts.append(frame.SESSION_NOTE + "\n\n")
    if s.server is not None:
        parts.append("## Server side (Prometheus)\n\n" + table(frame.server_table(s)) + "\n")
        if s.server.replica_balance is not None:
            of = "SM activity" if s.server.balance_source == "sm_active" else "busy fraction"
            parts.append(
                f"Replica balance: std-dev {fmt(s.server.replica_balance)} of {of}"
                f" ({s.server.balance_source}).\n\n"
            )
    if s.cross_check is not None:
        parts.append(
            "## Cross-check: records against Prometheus\n\n"
            + table(frame.crosscheck_table(s))
            + "\n"
        )
    notes = list(s.notes) + list(s.generator.reasons)
    if s.cross_check is not None:
        notes += list(s.cross_check.notes)
    if notes:
        parts.append("## Notes\n\n" + "".join(f"- {n}\n" for n in notes) + "\n")
    return "".join(parts)
