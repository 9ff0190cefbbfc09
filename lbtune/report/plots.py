"""The report's plots as PNG bytes (matplotlib's Agg canvas; no pyplot, no display).

Each function takes frame data (:mod:`lbtune.report.frame`) and returns PNG bytes;
an empty input still yields a plot that says "no data", so the report's layout
does not depend on the run.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lbtune.report.series import HistBin, LoadPoint, RatePoint, ReplicaPoint, TimePoint

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

BLUE, ORANGE, GREEN, RED, GREY = "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#7f7f7f"


def _figure(width: float = 8.0, height: float = 3.6, ncols: int = 1) -> tuple[Figure, list[Axes]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


AXES_KEY = "Description"
"""The PNG text chunk that names each panel's axes (:func:`axes_text`); the HTML
report reads it back into the image's alt text, so the page says what the axes are."""


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # No "Software" text chunk: the page must hold no external reference, even encoded.
    fig.savefig(buf, format="png", metadata={"Software": None, AXES_KEY: axes_text(fig)})
    return buf.getvalue()


def axes_text(fig: Figure) -> str:
    """``title: x = <label>, y = <label>`` per panel with data, ``colour = <label>`` per colour
    bar; ``(none)`` where a label is missing. A "no data" panel (no ticks) is left out."""
    parts = []
    for ax in fig.axes:
        if not ax.get_visible():  # an unused cell of a grid
            continue
        cbar = getattr(ax, "_colorbar", None)
        if cbar is not None:
            label = ax.get_ylabel() if cbar.orientation == "vertical" else ax.get_xlabel()
            parts.append(f"colour = {label or '(none)'}")
            continue
        if not len(ax.get_xticks()) and not len(ax.get_yticks()):
            continue
        x = ax.get_xlabel() or "(none)"
        y = ax.get_ylabel() or "(none)"
        parts.append(f"{ax.get_title() or 'plot'}: x = {x}, y = {y}")
    return "; ".join(parts)


def png_axes_text(png: bytes) -> str | None:
    """The :data:`AXES_KEY` text chunk of a PNG written by :func:`_png`, if any."""
    import struct

    pos = 8
    while pos + 8 <= len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind = png[pos + 4 : pos + 8]
        data = png[pos + 8 : pos + 8 + length]
        if kind == b"tEXt" and data.startswith(AXES_KEY.encode() + b"\0"):
            return data[len(AXES_KEY) + 1 :].decode("latin-1")
        if kind == b"IEND":
            break
        pos += 12 + length
    return None


def _no_data(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no data: {what}", ha="center", va="center", color=GREY)
    ax.set_xticks([])
    ax.set_yticks([])


def _series(points: Sequence[TimePoint], attr: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for p in points:
        v = getattr(p, attr)
        if v is not None:
            xs.append(p.t)
            ys.append(float(v))
    return xs, ys


def latency_over_time(
    points: Sequence[TimePoint], window: tuple[float, float], slo_ttft_ms: float | None
) -> bytes:
    """TTFT and E2E P50/P99 per second, each on its own panel (E2E runs to seconds where
    TTFT is milliseconds: on one axis TTFT would lie flat on zero); the window shaded."""
    fig, (left, right) = _figure(width=9.0, ncols=2)
    left.set_title("TTFT over time (per second, by send time)")
    right.set_title("End-to-end latency over time")
    if not points:
        _no_data(left, "no successful request")
        _no_data(right, "no successful request")
        return _png(fig)
    panels = (
        (left, "TTFT", "ttft_p50_ms", "ttft_p99_ms", BLUE, slo_ttft_ms),
        (right, "E2E", "e2e_p50_ms", "e2e_p99_ms", ORANGE, None),
    )
    for ax, name, p50, p99, color, slo in panels:
        for attr, label, style in ((p50, f"{name} P50", "-"), (p99, f"{name} P99", "--")):
            xs, ys = _series(points, attr)
            if xs:
                ax.plot(xs, ys, style, color=color, label=label, linewidth=1.4)
        ax.axvspan(window[0], window[1], color=GREEN, alpha=0.08, label="measurement window")
        if slo is not None:
            ax.axhline(slo, color=RED, linewidth=1, linestyle=":", label=f"{name} SLO")
        ax.set_xlabel("time since start (s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    return _png(fig)


def ttft_distribution(
    bins: Sequence[HistBin], p50_ms: float | None, p99_ms: float | None, slo_ms: float | None
) -> bytes:
    fig, (ax,) = _figure()
    ax.set_title("TTFT distribution (successful requests in the window)")
    if not bins:
        _no_data(ax, "no TTFT sample")
        return _png(fig)
    ax.bar(
        [b.lo_ms for b in bins],
        [b.count for b in bins],
        width=[b.hi_ms - b.lo_ms for b in bins],
        align="edge",
        color=BLUE,
        alpha=0.8,
    )
    for value, label, color in (
        (p50_ms, "P50", GREEN),
        (p99_ms, "P99", ORANGE),
        (slo_ms, "SLO", RED),
    ):
        if value is not None:
            ax.axvline(
                value, color=color, linestyle="--", linewidth=1.2, label=f"{label} {value:.0f} ms"
            )
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("requests")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return _png(fig)


def throughput_over_time(points: Sequence[RatePoint], window: tuple[float, float]) -> bytes:
    """Completed requests per second (by end time): the run's throughput as it went."""
    fig, (ax,) = _figure()
    ax.set_title("Completed throughput over time (per second, by end time)")
    if not points:
        _no_data(ax, "no completed request")
        return _png(fig)
    ax.plot(
        [p.t for p in points],
        [p.completed_per_s for p in points],
        color=BLUE,
        linewidth=1.4,
        label="completed (ok)",
    )
    ax.axvspan(window[0], window[1], color=GREEN, alpha=0.08, label="measurement window")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("completed req/s")
    ax.set_ylim(bottom=0, top=max(p.completed_per_s for p in points) * 1.2 or 1.0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return _png(fig)


def throughput_vs_load(
    points: Sequence[LoadPoint], knee_load: float | None, load_unit: str = "users or req/s"
) -> bytes:
    fig, (ax,) = _figure()
    ax.set_title("Completed throughput against offered load")
    if not points:
        _no_data(ax, "no stage")
        return _png(fig)
    ordered = sorted(points, key=lambda p: p.offered_load)
    ax.plot(
        [p.offered_load for p in ordered],
        [p.throughput_rps for p in ordered],
        color=GREY,
        linewidth=1,
        zorder=1,
    )
    colors = [GREY if p.meets_slo is None else (GREEN if p.meets_slo else RED) for p in points]
    ax.scatter(
        [p.offered_load for p in points],
        [p.throughput_rps for p in points],
        c=colors,
        s=40,
        zorder=2,
    )
    for p in points:
        ax.annotate(
            p.label,
            (p.offered_load, p.throughput_rps),
            fontsize=7,
            textcoords="offset points",
            xytext=(4, 4),
        )
    if knee_load is not None:
        label = f"knee at {knee_load:g} {load_unit}"
        ax.axvline(knee_load, color=GREEN, linestyle=":", label=label)
        ax.legend(fontsize=8)
    ax.set_xlabel(f"offered load ({load_unit})")
    ax.set_ylabel("completed req/s")
    ax.set_ylim(0, max(p.throughput_rps for p in points) * 1.2 or 1.0)
    ax.margins(x=0.08)
    ax.grid(alpha=0.3)
    return _png(fig)


def replica_load(points: Sequence[ReplicaPoint]) -> bytes:
    fig, (left, right) = _figure(width=9.0, ncols=2)
    left.set_title("Per-replica load")
    right.set_title("Per-replica latency")
    if not points:
        _no_data(left, "no replica")
        _no_data(right, "no replica")
        return _png(fig)
    names = [p.replica for p in points]
    xs = list(range(len(points)))
    width = 0.38
    left.bar(
        [x - width / 2 for x in xs],
        [p.share_pct for p in points],
        width,
        label="request share (%)",
        color=BLUE,
    )
    busy = [p.busy_pct if p.busy_pct is not None else 0.0 for p in points]
    if any(p.busy_pct is not None for p in points):
        left.bar([x + width / 2 for x in xs], busy, width, label="busy (%)", color=ORANGE)
    rotation = 0 if len(names) <= 6 else 30
    left.set_xticks(xs, names, rotation=rotation, ha="center" if rotation == 0 else "right")
    left.set_ylim(0, 100)
    left.set_ylabel("% (share of requests, time busy)")
    left.legend(fontsize=8)
    left.grid(alpha=0.3, axis="y")
    series: list[tuple[str, list[Any], str]] = [
        ("TTFT P50", [p.ttft_p50_ms for p in points], BLUE),
        ("TTFT P99", [p.ttft_p99_ms for p in points], "#aec7e8"),
        ("E2E P50", [p.e2e_p50_ms for p in points], ORANGE),
        ("E2E P99", [p.e2e_p99_ms for p in points], "#ffbb78"),
    ]
    w = 0.2
    for i, (label, values, color) in enumerate(series):
        right.bar(
            [x + (i - 1.5) * w for x in xs], [v or 0.0 for v in values], w, label=label, color=color
        )
    right.set_xticks(xs, names, rotation=rotation, ha="center" if rotation == 0 else "right")
    right.set_ylabel("latency (ms, log scale)")
    if any(v for _, values, _ in series for v in values):
        right.set_yscale("log")  # TTFT is ms where E2E is seconds: both stay visible
    left.set_xlabel("replica")
    right.set_xlabel("replica")
    if any(v is None for _, values, _ in series for v in values):
        right.set_xlabel("replica (no bar: too few samples for that figure)")
    right.legend(fontsize=7)
    right.grid(alpha=0.3, axis="y")
    return _png(fig)
