"""``report.html``: one self-contained page (inline CSS, plots as base64 PNG, no links out)."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

from lbtune.metrics.summary import RunSummary
from lbtune.records.requests import RequestRecord
from lbtune.report import frame, plots, series
from lbtune.report.frame import Table
from lbtune.report.markdown import fmt, numeric, when

CSS = """
:root { --fg: #1d2430; --muted: #5b6472; --line: #d9dee5; --bg: #f6f7f9; --ok: #1a7f37;
        --bad: #cf222e; --warn: #9a6700; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--fg); background: var(--bg); }
main { max-width: 1360px; margin: 0 auto; padding: 24px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 10px; border-bottom: 1px solid var(--line);
     padding-bottom: 4px; }
.meta { color: var(--muted); margin-bottom: 16px; }
.warn { background: #fff1e5; border: 1px solid #f0b37e; border-left: 6px solid var(--bad);
        padding: 10px 14px; margin: 8px 0; font-weight: 600; border-radius: 4px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(160px, 1fr));
         gap: 10px; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px; }
.card .k { color: var(--muted); font-size: 12px; }
.card .v { font-size: 22px; font-weight: 600; }
.card .u { color: var(--muted); font-size: 12px; margin-left: 3px; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(100%, 560px), 1fr));
         gap: 14px; }
figure { margin: 0; background: #fff; border: 1px solid var(--line); border-radius: 6px;
         padding: 8px; }
figure img { width: 100%; height: auto; display: block; }
figure.wide { grid-column: 1 / -1; }
figure.wide img { max-width: 1100px; margin: 0 auto; }
figcaption { color: var(--muted); font-size: 12px; padding-top: 4px; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; background: #fff; border: 1px solid var(--line);
        font-variant-numeric: tabular-nums; }
th, td { padding: 5px 8px; border-bottom: 1px solid var(--line); text-align: right;
         white-space: nowrap; }
th { white-space: normal; max-width: 8em; vertical-align: bottom; }
td.long { white-space: normal; min-width: 16em; text-align: left; }
th.t, td.t { text-align: left; }
th { background: #eef1f4; font-weight: 600; }
td.pass, td.agree, td.yes { color: var(--ok); font-weight: 600; }
td.FAIL, td.DISAGREE, td.no { color: var(--bad); font-weight: 600; }
ul.notes li { margin: 3px 0; }
.verdict { font-size: 15px; font-weight: 600; margin: 10px 0; }
"""

PLOT_CAPTIONS = {
    "latency": "TTFT (left) and end-to-end latency (right) over time, P50 and P99 per second of "
    "send time; the shaded band is the measurement window.",
    "ttft": "TTFT distribution in the measurement window, with P50, P99 and the SLO.",
    "throughput": "Completed throughput against offered load per stage (green: meets the SLO).",
    "throughput_time": "Completed requests per second over the run (one stage: no offered-load "
    "curve to draw); the shaded band is the measurement window.",
    "replicas": "Per-replica request share, busy fraction and latency.",
}


def ttft_caption(summary: RunSummary) -> str:
    """What the TTFT histogram draws, and why a line is missing (too few samples)."""
    lat, slo = summary.latency.ttft, summary.slo
    lines = ["P50" if lat.p50 is not None else None, "P99" if lat.p99 is not None else None]
    if slo is not None and slo.ttft_s is not None:
        lines.append("the SLO")
    drawn = [x for x in lines if x]
    text = "TTFT distribution in the measurement window"
    text += f", with {' and '.join(drawn)} as dashed lines." if drawn else "."
    if lat.p99 is None:
        text += f" No P99 line: {lat.count} samples are too few for a P99 (100 needed)."
    return text


LONG_CELL = 48
"""Cells longer than this many characters wrap (``td.long``)."""


def esc(value: object) -> str:
    """HTML-escaped text; ``://`` written as entities, so a URL shown as text (the target,
    a Prometheus address in a note) leaves no literal ``http://`` in the page source."""
    return html.escape(str(value), quote=True).replace("://", ":&#47;&#47;")


def table(t: Table) -> str:
    if not t.rows:
        return "<p><em>none</em></p>"
    align = ["" if numeric(t, i) else ' class="t"' for i in range(len(t.columns))]
    head = "".join(f"<th{a}>{esc(c)}</th>" for c, a in zip(t.columns, align, strict=True))
    body = []
    for row in t.rows:
        cells = []
        for i, c in enumerate(row):
            text = fmt(c)
            verdict = text in ("pass", "FAIL", "agree", "DISAGREE", "yes", "no")
            cls = f' class="t {esc(text)}"' if verdict else align[i]
            if len(text) > LONG_CELL:  # a note or a reason: wrap it rather than widen the table
                cls = ' class="t long"'
            cells.append(f"<td{cls}>{esc(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    rows = "".join(body)
    return (
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{rows}</tbody></table></div>"
    )


WIDE_PLOTS = frozenset({"slices"})
"""Plots that take a whole row of the grid (many small panels)."""


def img(png: bytes, alt: str, caption: str) -> str:
    """A figure whose alt text names the plot's axes, read from the PNG (plots.axes_text)."""
    data = base64.b64encode(png).decode("ascii")
    axes = plots.png_axes_text(png)
    wide = ' class="wide"' if alt in WIDE_PLOTS else ""
    alt = f"{alt}: {axes}" if axes else alt
    return (
        f'<figure{wide}><img src="data:image/png;base64,{data}" alt="{esc(alt)}">'
        f"<figcaption>{esc(caption)}</figcaption></figure>"
    )


def render_plots(summary: RunSummary, records: Sequence[RequestRecord]) -> dict[str, bytes]:
    """The four plots of the report, by key (see :data:`PLOT_CAPTIONS`)."""
    s = summary
    slo_ttft_ms = frame.ms(s.slo.ttft_s) if s.slo is not None else None
    window = (s.window.start - s.run_start, s.window.end - s.run_start)
    return {
        "latency": plots.latency_over_time(
            series.latency_over_time(records, s.run_start), window, slo_ttft_ms
        ),
        "ttft": plots.ttft_distribution(
            series.ttft_histogram(records, s),
            frame.ms(s.latency.ttft.p50),
            frame.ms(s.latency.ttft.p99),
            slo_ttft_ms,
        ),
        **_throughput_plot(s, records, window),
        "replicas": plots.replica_load(series.replica_load(s)),
    }


def _throughput_plot(
    s: RunSummary, records: Sequence[RequestRecord], window: tuple[float, float]
) -> dict[str, bytes]:
    """Throughput against offered load when there are stages to compare, else over time."""
    points = series.throughput_vs_load(s)
    if len({p.offered_load for p in points}) > 1:
        return {
            "throughput": plots.throughput_vs_load(points, s.knee_offered_load, frame.load_unit(s))
        }
    over_time = series.throughput_over_time(records, s.run_start)
    return {"throughput_time": plots.throughput_over_time(over_time, window)}


def _cards(summary: RunSummary) -> str:
    lat, t = summary.latency, summary.throughput
    cards = [
        ("TTFT P50", frame.ms(lat.ttft.p50), "ms"),
        ("TTFT P99", frame.ms(lat.ttft.p99), "ms"),
        ("E2E P99", frame.ms(lat.e2e.p99), "ms"),
        ("Throughput", t.requests_per_s, "req/s"),
        ("Output tokens", t.output_tokens_per_s, "tok/s"),
        ("Goodput", t.goodput_per_s, "req/s"),
        ("Error rate", frame.pct(summary.outcomes.error_rate), "%"),
        ("Sent (window)", summary.outcomes.sent, ""),
    ]
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><div class="k">{esc(k)}</div><span class="v">{esc(fmt(v))}</span>'
            f'<span class="u">{esc(u)}</span></div>'
            for k, v, u in cards
        )
        + "</div>"
    )


def render(summary: RunSummary, records: Sequence[RequestRecord]) -> str:
    s = summary
    images = render_plots(s, records)
    body = [f"<h1>lbtune report: {esc(s.scenario)}</h1>"]
    body.append(
        f'<div class="meta">Target <code>{esc(s.target)}</code> · started {esc(when(s.run_start))}'
        f" · window {s.window.start - s.run_start:.1f}–{s.window.end - s.run_start:.1f} s"
        f" ({s.window.duration:.1f} s) · {esc(s.mode)} loop · lbtune {esc(s.lbtune_version)}"
        f" · schema {s.schema_version}</div>"
    )
    body += [f'<div class="warn">⚠ {esc(w)}</div>' for w in frame.warnings(s)]
    body.append(f'<p class="verdict">{esc(frame.verdict(s))}</p>')
    body.append(_cards(s))
    if s.slo is not None:
        body.append("<h2>SLO checks</h2>" + table(frame.slo_table(s)))
    body.append('<h2>Plots</h2><div class="plots">')
    captions = {**PLOT_CAPTIONS, "ttft": ttft_caption(s)}
    body += [img(png, k, captions[k]) for k, png in images.items()]
    body.append("</div>")
    body.append("<h2>Summary</h2>" + table(frame.headline(s)))
    body.append("<h2>Latency</h2>" + table(frame.latency_table(s)))
    body.append("<h2>Outcomes (requests sent in the window)</h2>" + table(frame.outcome_table(s)))
    body.append("<h2>Per replica</h2>" + table(frame.replica_table(s)))
    if s.stages:
        body.append("<h2>Stages</h2>" + table(frame.stage_table(s)))
    if s.sessions is not None:
        body.append(
            "<h2>Agent sessions</h2>"
            + table(frame.session_table(s))
            + f'<p class="meta">{esc(frame.SESSION_NOTE)}</p>'
        )
    if s.server is not None:
        body.append("<h2>Server side (Prometheus)</h2>" + table(frame.server_table(s)))
    if s.cross_check is not None:
        body.append(
            "<h2>Cross-check: records against Prometheus</h2>" + table(frame.crosscheck_table(s))
        )
    notes = list(s.notes) + list(s.generator.reasons)
    if s.cross_check is not None:
        notes += list(s.cross_check.notes)
    if notes:
        body.append(
            '<h2>Notes</h2><ul class="notes">'
            + "".join(f"<li>{esc(n)}</li>" for n in notes)
            + "</ul>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>lbtune report: {esc(s.scenario)}</title><style>{CSS}</style></head>"
        f"<body><main>{''.join(body)}</main></body></html>\n"
    )
