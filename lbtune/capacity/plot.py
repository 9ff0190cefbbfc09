"""A capacity search's plot (``capacity.png``) as PNG bytes, drawn with the run report's
helpers (:mod:`lbtune.report.plots`: matplotlib's Agg canvas, no pyplot).

Left, attainment against the level (offered rate, or closed-loop users): every probe
with its Wilson interval (those whose generator fell behind hollow and grey: the estimate
leaves them out), the fitted monotone curve (linear between probed levels, as the
crossing is interpolated), the target, the capacity with its CI shaded (to the right edge
when the CI is open above), the cliff hatched; the twin's search beside the live one in
another colour. Middle (right when there is no third panel): the live probes' TTFT and
TPOT P50/P99 against the level, with the SLO's bounds. Right, when the live probes
attributed requests to replicas: each replica's attainment against the level
(:func:`_replicas`); a search without attribution keeps the two panels. A report without a
probe still yields a plot that says "no data".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lbtune.capacity.frame import CapacityReport, SearchFrame
from lbtune.capacity.search import ProbeLatency, Unit, amount
from lbtune.report.plots import BLUE, GREEN, GREY, ORANGE, RED, _figure, _no_data, _png

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["capacity_plot", "figure"]

COLOURS = {"live": BLUE, "twin": ORANGE}
"""Each search's colour (its probes, curve, capacity and CI)."""

LEVELS: dict[Unit, tuple[str, str]] = {
    "req/s": ("offered rate", "offered rate (req/s)"),
    "users": ("closed-loop users", "closed-loop users (count)"),
}
"""What a search's level is called in a title, and on an axis."""
LOG_RANGE = 20.0
"""Latencies spanning more than this factor go on a log axis (TTFT P99 under overload
runs to seconds where TPOT stays at tens of milliseconds)."""


def capacity_plot(report: CapacityReport) -> bytes:
    """:func:`figure` as PNG bytes (``capacity.png``)."""
    return _png(figure(report))


def figure(report: CapacityReport) -> Figure:
    """Attainment against the level (left), TTFT/TPOT against it (middle), and, when the
    live probes attributed requests, each replica's attainment against it (right)."""
    per = _per_replica(report.live)
    fig, axes = _figure(width=16.0 if per else 11.0, height=4.8, ncols=3 if per else 2)
    fig.suptitle(f"Capacity at SLO: {report.scenario} against {report.target}", fontsize=10)
    unit: Unit = next((s.unit for s in (report.live, report.twin) if s is not None), "req/s")
    noun, xlabel = LEVELS[unit]
    axes[0].set_title(f"Attainment against {noun}")
    axes[1].set_title(f"Latency against {noun} (live probes)")
    _attainment(axes[0], report, xlabel)
    _latency(axes[1], report, xlabel)
    if per:
        axes[2].set_title(f"Attainment per replica against {noun} (live probes)")
        _replicas(axes[2], per, report.attainment, xlabel)
    return fig


def _attainment(ax: Axes, report: CapacityReport, xlabel: str) -> None:
    searches = [s for s in (report.live, report.twin) if s is not None and s.probes]
    if not searches:
        _no_data(ax, "no probe")
        return
    lows = [report.attainment]
    for s in searches:
        colour = COLOURS.get(s.source, GREEN)
        lows += _probes(ax, s, colour, report.confidence)
        if s.curve:
            rates, fitted = [r for r, _ in s.curve], [f for _, f in s.curve]
            ax.plot(rates, fitted, "-", color=colour, linewidth=1.4, label=f"{s.source} fitted")
            lows += fitted
        if s.capacity is not None:
            at = "≥ " if s.kind == "above" else ""
            label = f"{s.source} capacity {at}{amount(s.capacity, s.unit, '.4g')}"
            ax.axvline(s.capacity, color=colour, linestyle="--", linewidth=1.2, label=label)
        if s.cliff is not None:
            a, b = s.cliff
            label = f"{s.source} cliff {a:.4g}–{amount(b, s.unit, '.4g')}"
            ax.axvspan(a, b, facecolor="none", edgecolor=RED, hatch="//", lw=0, label=label)
    ax.axhline(
        report.attainment,
        color=RED,
        linestyle=":",
        linewidth=1.2,
        label=f"target {report.attainment:.4g}",
    )
    ax.margins(x=0.08)
    ax.set_xlim(left=0)
    right = ax.get_xlim()[1]
    for s in searches:  # after the limits: an open end is shaded to the right edge
        _capacity_band(ax, s, right, report.confidence)
    ax.set_xlim(0, right)
    ax.set_ylim(max(0.0, min(lows) - 0.03), 1.01)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("attainment (share of requests meeting the SLO)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")


def _probes(ax: Axes, s: SearchFrame, colour: str, confidence: float) -> list[float]:
    """Each probe with its Wilson interval; those whose generator fell behind hollow and
    grey. The intervals' lower ends (for the y axis)."""
    lows: list[float] = []
    for behind in (False, True):
        rows = [
            (p.rate, p.attainment, p.ci)
            for p in s.probes
            if bool(p.behind) is behind and p.attainment is not None
        ]
        if not rows:
            continue
        ys = [a for _, a, _ in rows]
        err = [
            [max(0.0, a - lo) for _, a, (lo, _) in rows],
            [max(0.0, hi - a) for _, a, (_, hi) in rows],
        ]
        label = f"{s.source} probes ({confidence:.0%} Wilson CI)"
        if behind:
            label = f"{s.source}: generator fell behind (not used)"
        ax.errorbar(
            [r for r, _, _ in rows],
            ys,
            yerr=err,
            fmt="o",
            color=GREY if behind else colour,
            markerfacecolor="none" if behind else colour,
            markersize=5,
            capsize=2,
            linewidth=1,
            label=label,
        )
        lows += [lo for _, _, (lo, _) in rows]
    return lows


def _capacity_band(ax: Axes, s: SearchFrame, right: float, confidence: float) -> None:
    """The capacity's CI shaded, to ``right`` when open above; a capacity that is only a
    lower bound (every probe met the target) shaded from it to ``right``."""
    colour = COLOURS.get(s.source, GREEN)
    if s.ci is not None:
        lo, hi = s.ci
        label = f"{s.source} capacity {confidence:.0%} CI"
        if hi is None:
            label += " (open above)"
        ax.axvspan(lo, right if hi is None else hi, color=colour, alpha=0.12, label=label)
    elif s.kind == "above" and s.capacity is not None:
        label = f"{s.source}: every probe met the target"
        ax.axvspan(s.capacity, right, color=colour, alpha=0.06, label=label)


_SERIES: tuple[tuple[str, Callable[[ProbeLatency], float | None], str, str], ...] = (
    ("TTFT P50", lambda lat: lat.ttft_p50, BLUE, "-"),
    ("TTFT P99", lambda lat: lat.ttft_p99, BLUE, "--"),
    ("TPOT P50", lambda lat: lat.tpot_p50, GREEN, "-"),
    ("TPOT P99", lambda lat: lat.tpot_p99, GREEN, "--"),
)


def _latency(ax: Axes, report: CapacityReport, xlabel: str) -> None:
    probes = report.live.probes if report.live is not None else ()
    rows = sorted(
        ((p.rate, bool(p.behind), p.latency) for p in probes if p.latency is not None),
        key=lambda row: row[0],
    )
    values: list[float] = []
    behind_label = "hollow: generator fell behind"
    for label, read, colour, style in _SERIES:
        for late in (False, True):
            pts = [
                (r, sec * 1000)
                for r, b, lat in rows
                if b is late and (sec := read(lat)) is not None
            ]
            if not pts:
                continue
            xs, ys = [r for r, _ in pts], [y for _, y in pts]
            values += ys
            if late:  # hollow, apart from the line: the generator was measured, not the cluster
                ax.plot(xs, ys, "o", color=colour, markerfacecolor="none", label=behind_label)
                behind_label = "_"  # one legend entry
            else:
                ax.plot(xs, ys, style, marker="o", markersize=3, color=colour, label=label)
    if not values:
        _no_data(ax, "no latency percentile of a live probe")
        return
    for name, bound, colour in (
        ("TTFT", report.slo.ttft_s, BLUE),
        ("TPOT", report.slo.tpot_s, GREEN),
    ):
        if bound is not None:
            label = f"{name} SLO {bound * 1000:.4g} ms"
            ax.axhline(bound * 1000, color=colour, linestyle=":", linewidth=1.2, label=label)
            values.append(bound * 1000)
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > LOG_RANGE:
        ax.set_yscale("log")
        ax.set_ylabel("latency (ms, log scale)")
    else:
        ax.set_ylim(bottom=0, top=max(values) * 1.1 or 1.0)
        ax.set_ylabel("latency (ms)")
    ax.margins(x=0.08)
    ax.set_xlim(left=0)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")


def _per_replica(live: SearchFrame | None) -> dict[str, list[tuple[float, float]]]:
    """(level, attainment) per replica over the live probes whose generator kept up,
    probes at one level pooled (met and judged summed, as the fit pools them)."""
    pooled: dict[str, dict[float, tuple[int, int]]] = {}
    for p in live.probes if live is not None else ():
        if p.behind:
            continue
        for r in p.replicas:
            met, judged = pooled.setdefault(r.replica, {}).get(p.rate, (0, 0))
            pooled[r.replica][p.rate] = (met + r.met, judged + r.judged)
    return {
        name: [(rate, m / n) for rate, (m, n) in sorted(levels.items()) if n]
        for name, levels in sorted(pooled.items())
        if any(n for _, n in levels.values())
    }


def _replicas(
    ax: Axes, per: dict[str, list[tuple[float, float]]], target: float, xlabel: str
) -> None:
    """One line per replica: its attainment against the level, with the target.

    Attainment rather than TTFT P99: it is what the capacity is defined by, so the
    replica whose line falls below the target first is the one that sets the capacity;
    and it exists for every replica at every probe, where a P99 is withheld below 100
    samples (a 200-request probe over four replicas has about 50 each)."""
    lows = [target]
    for name, pts in per.items():
        ys = [a for _, a in pts]
        ax.plot([r for r, _ in pts], ys, "-", marker="o", markersize=3, label=name)
        lows += ys
    ax.axhline(target, color=RED, linestyle=":", linewidth=1.2, label=f"target {target:.4g}")
    ax.margins(x=0.08)
    ax.set_xlim(left=0)
    ax.set_ylim(max(0.0, min(lows) - 0.03), 1.01)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("attainment of the replica's requests")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left", title="replica", title_fontsize=7)
