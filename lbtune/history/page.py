"""History as rows (pure), a plot (PNG bytes) and a self-contained HTML page.

The figures shown for an entry are what it measured of the live config: a stress run's
figures, or a study's baseline trial. An accepted study adds the figures of the config it
rolled out (its verification run), drawn as stars.
"""

from __future__ import annotations

import base64
import html
import io
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lbtune.history.drift import DriftReport
from lbtune.history.store import Entry, KeyFigures

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["COLUMNS", "page", "plot", "rows"]

COLUMNS = (
    "time",
    "kind",
    "name",
    "P99 E2E ms",
    "TTFT P50 ms",
    "TTFT P99 ms",
    "req/s",
    "goodput/s",
    "errors",
    "gen",
    "config",
    "outcome",
)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _outcome(e: Entry) -> str:
    if e.kind == "stress":
        return ""
    ref = e.reference
    if e.accepted and ref is not None and ref.p99_e2e_s is not None:
        trial = "" if e.winner_trial is None else f" #{e.winner_trial}"
        return f"accepted{trial} (P99 E2E {_ms(ref.p99_e2e_s)} ms)"
    return "accepted" if e.accepted else (e.verdict or "")


def rows(entries: Sequence[Entry]) -> list[dict[str, str]]:
    """One row of formatted cells per entry, keyed by :data:`COLUMNS`."""
    out = []
    for e in entries:
        f = e.current or KeyFigures()
        name = e.study if e.kind == "study" and e.study else (e.report_dir or "").rsplit("/", 1)[-1]
        gen = "" if f.degraded is None else ("behind" if f.degraded else "ok")
        errors = "-" if f.error_rate is None else f"{f.error_rate:.1%}"
        cells = (
            _when(e.time),
            e.kind,
            name,
            _ms(f.p99_e2e_s),
            _ms(f.p50_ttft_s),
            _ms(f.p99_ttft_s),
            _num(f.requests_per_s),
            _num(f.goodput_per_s),
            errors,
            gen,
            (e.config_hash or "")[:10],
            _outcome(e),
        )
        out.append(dict(zip(COLUMNS, cells, strict=True)))
    return out


def plot(entries: Sequence[Entry], title: str) -> bytes:
    """Latency, throughput and error rate over time as PNG bytes (Agg, no pyplot)."""
    from matplotlib.figure import Figure

    def day(t: float) -> float:  # matplotlib's date unit (days since its 1970 epoch), local time
        return (t + time.localtime(t).tm_gmtoff) / 86400.0

    fig = Figure(figsize=(10.0, 7.5), dpi=100, layout="constrained")
    lat, thr, err = fig.subplots(3, 1, sharex=True)
    fig.suptitle(title)
    pts = [(day(e.time), e, e.current) for e in entries if e.current]
    if not pts:
        lat.text(0.5, 0.5, "no data", ha="center", va="center", color="#7f7f7f")
        return _png(fig)

    def series(ax: Axes, attr: str, label: str, color: str, scale: float = 1.0) -> None:
        xs = [t for t, _, f in pts if getattr(f, attr) is not None]
        ys = [getattr(f, attr) * scale for _, _, f in pts if getattr(f, attr) is not None]
        ax.plot(xs, ys, color=color, alpha=0.5, lw=1, label=label)
        for kind, marker in (("stress", "o"), ("study", "s")):
            mine = [
                (t, getattr(f, attr) * scale)
                for t, e, f in pts
                if e.kind == kind and getattr(f, attr) is not None
            ]
            if mine:
                ax.plot(*zip(*mine, strict=True), marker=marker, ls="", color=color)

    series(lat, "p99_e2e_s", "P99 E2E", "#1f77b4", 1000)
    series(lat, "p99_ttft_s", "P99 TTFT", "#ff7f0e", 1000)
    series(lat, "p50_ttft_s", "P50 TTFT", "#2ca02c", 1000)
    acc = [(day(e.time), e.reference) for e in entries if e.reference]
    if acc:
        lat.plot(
            [t for t, _ in acc],
            [(r.p99_e2e_s or 0) * 1000 for _, r in acc],
            marker="*",
            ms=14,
            ls="",
            color="#d62728",
            label="P99 E2E, accepted config",
        )
    bad = [(t, f.p99_e2e_s * 1000) for t, _, f in pts if f.degraded and f.p99_e2e_s]
    if bad:
        lat.plot(
            *zip(*bad, strict=True),
            marker="x",
            ms=10,
            ls="",
            color="#000",
            label="generator fell behind",
        )
    lat.set_ylabel("ms")
    series(thr, "requests_per_s", "req/s", "#1f77b4")
    series(thr, "goodput_per_s", "goodput/s", "#2ca02c")
    thr.set_ylabel("per second")
    series(err, "error_rate", "errors", "#d62728", 100)
    err.set_ylabel("% of sent")
    for ax in (lat, thr, err):
        ax.xaxis_date()
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.autofmt_xdate()
    return _png(fig)


def _png(fig: object) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})  # type: ignore[attr-defined]
    return buf.getvalue()


_CSS = """
body { margin: 0; font: 14px/1.45 system-ui, sans-serif; color: #1d2430; background: #f6f7f9; }
main { max-width: 1200px; margin: 0 auto; padding: 24px; }
h1 { font-size: 24px; } h2 { font-size: 17px; border-bottom: 1px solid #d9dee5; }
table { border-collapse: collapse; background: #fff; font-size: 13px; }
td, th { border: 1px solid #d9dee5; padding: 3px 8px; text-align: right; white-space: nowrap; }
th { background: #eef1f5; } td:nth-child(-n+3) { text-align: left; }
.drift { background: #fff1e5; border-left: 6px solid #cf222e; padding: 8px 12px; }
.ok { background: #eaf6ec; border-left: 6px solid #1a7f37; padding: 8px 12px; }
img { max-width: 100%; background: #fff; border: 1px solid #d9dee5; }
.scroll { overflow-x: auto; }
"""


def _drift_html(d: DriftReport) -> str:
    if d.drift:
        names = ", ".join(d.drifted)
        text = "<b>Drift</b>: the newest run is significantly worse than the last accepted "
        text += f"config in {html.escape(names)}"
        css = "drift"
    else:
        text = "No drift" + (f" ({html.escape('; '.join(d.notes))})" if d.notes else "")
        css = "ok"
    items = "".join(
        f"<li>{html.escape(c.name)}: {c.current:.4g} now, {c.reference:.4g} accepted"
        + (f", change {c.change:+.1%}" if c.change is not None and c.name != "error_rate" else "")
        + (f", 95% CI {c.ci[0] * 1000:+.0f}..{c.ci[1] * 1000:+.0f} ms" if c.ci else "")
        + (" — <b>drifted</b>" if c.drifted else "")
        + "</li>"
        for c in d.checks
        if c.current is not None and c.reference is not None
    )
    return f'<p class="{css}">{text}</p>' + (f"<ul>{items}</ul>" if items else "")


def page(entries: Sequence[Entry], drift: Sequence[DriftReport] = ()) -> str:
    """The whole page: per scenario, its drift verdict, the plot and the table."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>lbtune history</title>"
        f"<style>{_CSS}</style></head><body><main><h1>lbtune history</h1>"
        f"<p>{len(entries)} runs and studies, generated {_when(time.time())}.</p>"
    ]
    by_drift = {d.scenario: d for d in drift}
    for scenario in sorted({e.scenario for e in entries}):
        mine = [e for e in entries if e.scenario == scenario]
        parts.append(f"<h2>{html.escape(scenario)}</h2>")
        if scenario in by_drift:
            parts.append(_drift_html(by_drift[scenario]))
        png = base64.b64encode(plot(mine, f"{scenario}: figures over time")).decode()
        parts.append(
            f'<figure><img alt="figures over time" src="data:image/png;base64,{png}">'
            "<figcaption>Circles: stress runs; squares: study baselines (the live config as "
            "trial 0); stars: the config an accepted study rolled out.</figcaption></figure>"
        )
        head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(r[c])}</td>" for c in COLUMNS) + "</tr>"
            for r in reversed(rows(mine))
        )
        parts.append(f'<div class="scroll"><table><tr>{head}</tr>{body}</table></div>')
    parts.append("</main></body></html>")
    return "\n".join(parts)
