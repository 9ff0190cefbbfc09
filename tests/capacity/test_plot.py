"""``capacity.png``: what the capacity plot draws, read back from its figure and its PNG."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

from lbtune.capacity.fit import wilson
from lbtune.capacity.frame import CapacityReport, ProbeRow, SearchFrame
from lbtune.capacity.plot import capacity_plot, figure
from lbtune.capacity.replicas import ReplicaFigures
from lbtune.capacity.report import dumps, write
from lbtune.capacity.search import ProbeLatency
from lbtune.records.slo import Slo
from lbtune.report.plots import BLUE, ORANGE, png_axes_text

PNG = b"\x89PNG\r\n\x1a\n"
ATTAINMENT_AXES = (
    "Attainment against offered rate: x = offered rate (req/s), "
    "y = attainment (share of requests meeting the SLO)"
)
LATENCY_AXES = "Latency against offered rate (live probes): x = offered rate (req/s), y = "
BEHIND = ("sending lagged 2.1 s behind schedule",)


def row(
    rate: float, met: int, *, behind: tuple[str, ...] = (), ttft: float = 0.2, source: str = "live"
) -> ProbeRow:
    """A probe of 400 requests; TTFT ``ttft`` s at P50 and ten times that at P99."""
    lat = ProbeLatency(ttft, ttft * 10, 0.03, 0.09)
    return ProbeRow(rate, met / 400, wilson(met, 400), met, 400, behind, source, None, 60.0, lat)


def cliff_search() -> SearchFrame:
    """Bracketed at 9–10 req/s with a cliff there (97.5 % to 37.5 %), and a probe at 12
    req/s whose generator fell behind (left out of the curve)."""
    probes = (
        row(4.0, 400, ttft=0.1),
        row(8.0, 398, ttft=0.15),
        row(9.0, 390, ttft=0.3),
        row(10.0, 150, ttft=2.0),
        row(12.0, 100, behind=BEHIND, ttft=5.0),
    )
    curve = ((4.0, 1.0), (8.0, 0.995), (9.0, 0.975), (10.0, 0.375))
    cap = 9.0 + (0.975 - 0.95) / (0.975 - 0.375)
    return SearchFrame(
        "live", "bracketed", cap, (9.0, 10.0), False, None, (9.0, 10.0), curve, probes, 300.0
    )


def report(live: SearchFrame | None, twin: SearchFrame | None = None) -> CapacityReport:
    slo = Slo(ttft_s=1.0, tpot_s=0.1, e2e_s=20.0)
    return CapacityReport("chat", "the embedded cluster", slo, 0.95, 0.1, 0.9, live, twin)


def legend(ax: Axes) -> list[str]:
    leg = ax.get_legend()
    return [] if leg is None else [t.get_text() for t in leg.get_texts()]


def span(ax: Axes, label: str) -> tuple[float, float]:
    """The x extent (data) of the shaded band labelled ``label``."""
    (patch,) = [p for p in ax.patches if p.get_label() == label]
    assert isinstance(patch, Rectangle)
    return patch.get_x(), patch.get_x() + patch.get_width()


def test_a_bracketed_search_shows_its_probes_curve_target_capacity_ci_and_cliff() -> None:
    left, _ = figure(report(cliff_search())).axes
    labels = legend(left)
    assert sorted(labels) == sorted(
        [
            "live probes (90% Wilson CI)",
            "live: generator fell behind (not used)",
            "live fitted",
            "live capacity 9.042 req/s",
            "live cliff 9–10 req/s",
            "target 0.95",
            "live capacity 90% CI",
        ]
    )
    assert span(left, "live capacity 90% CI") == (9.0, 10.0)
    assert span(left, "live cliff 9–10 req/s") == (9.0, 10.0)
    kept, late = left.containers
    assert str(kept.get_label()).startswith("live probes")
    assert str(late.get_label()).endswith("(not used)")
    assert kept[0].get_markerfacecolor() == BLUE and late[0].get_markerfacecolor() == "none"
    assert list(late[0].get_xdata()) == [12.0]  # the behind probe, on its own
    assert left.get_xlim()[1] > 12.0  # every probe inside the plot
    assert left.get_ylim()[0] <= wilson(100, 400)[0]  # and its whole interval


def test_both_panels_name_their_axes_in_the_png() -> None:
    png = capacity_plot(report(cliff_search()))
    assert png.startswith(PNG)
    # TTFT P99 of 50 s against TPOT P50 of 30 ms: the latency axis is a log one.
    assert png_axes_text(png) == f"{ATTAINMENT_AXES}; {LATENCY_AXES}latency (ms, log scale)"


def test_the_latency_panel_has_four_percentiles_and_the_slo_bounds() -> None:
    _, ax = figure(report(cliff_search())).axes
    assert ax.get_yscale() == "log"
    assert legend(ax) == [
        "TTFT P50",
        "hollow: generator fell behind",
        "TTFT P99",
        "TPOT P50",
        "TPOT P99",
        "TTFT SLO 1000 ms",
        "TPOT SLO 100 ms",
    ]
    lines = {line.get_label(): line for line in ax.get_lines()}
    p99, slo = lines["TTFT P99"], lines["TTFT SLO 1000 ms"]
    assert np.asarray(p99.get_xdata()).tolist() == [4.0, 8.0, 9.0, 10.0]  # the behind one apart
    assert np.asarray(p99.get_ydata()).tolist() == pytest.approx([1000, 1500, 3000, 20000])
    assert np.asarray(slo.get_ydata()).tolist() == [1000.0, 1000.0]
    # 60 ms to the TTFT bound's 1000 ms: within the factor of 20, a linear axis.
    lat = ProbeLatency(0.3, 0.6, 0.06, 0.09)
    narrow = tuple(replace(p, latency=lat) for p in cliff_search().probes)
    _, flat = figure(report(replace(cliff_search(), probes=narrow))).axes
    assert flat.get_yscale() == "linear" and flat.get_ylabel() == "latency (ms)"


def test_an_open_ci_is_shaded_to_the_right_edge() -> None:
    live = replace(cliff_search(), ci=(9.0, None), cliff=None)
    left, _ = figure(report(live)).axes
    label = "live capacity 90% CI (open above)"
    assert label in legend(left) and not any("cliff" in t for t in legend(left))
    lo, hi = span(left, label)
    assert lo == 9.0 and hi == left.get_xlim()[1]


def test_an_empty_report_says_no_data() -> None:
    empty = SearchFrame("live", "below", None, None, False, "stopped", None, (), (), 0.0)
    for r in (report(None), report(empty)):
        fig = figure(r)
        for ax in fig.axes:
            assert [t.get_text()[:8] for t in ax.texts] == ["no data:"]
            assert ax.get_legend() is None
        png = capacity_plot(r)
        assert png.startswith(PNG)
        assert not png_axes_text(png)  # no panel with axes to name


def test_the_twin_is_drawn_beside_the_live_search_in_its_own_colour() -> None:
    twin_probes = tuple(
        row(rate, met, source="twin") for rate, met in ((5.0, 400), (10.0, 392), (12.0, 300))
    )
    curve = ((5.0, 1.0), (10.0, 0.98), (12.0, 0.75))
    cap = 10.0 + (0.98 - 0.95) / (0.98 - 0.75) * 2.0
    twin = SearchFrame(
        "twin", "bracketed", cap, (10.0, 12.0), True, None, None, curve, twin_probes, 16.0
    )
    left, _ = figure(report(cliff_search(), twin)).axes
    labels = legend(left)
    assert {"twin probes (90% Wilson CI)", "twin fitted", "twin capacity 90% CI"} <= set(labels)
    assert f"twin capacity {cap:.4g} req/s" in labels and "live capacity 9.042 req/s" in labels
    (probes,) = [c for c in left.containers if str(c.get_label()).startswith("twin")]
    assert probes[0].get_color() == ORANGE
    assert span(left, "twin capacity 90% CI") == (10.0, 12.0)


def test_a_search_that_met_the_target_everywhere_is_a_lower_bound() -> None:
    probes = (row(4.0, 400), row(8.0, 399))
    above = SearchFrame(
        "live", "above", 8.0, None, False, "max rate", None, ((4.0, 1.0), (8.0, 0.9975)), probes, 1
    )
    left, _ = figure(report(above)).axes
    assert "live capacity ≥ 8 req/s" in legend(left)
    lo, hi = span(left, "live: every probe met the target")
    assert lo == 8.0 and hi == left.get_xlim()[1]


def test_write_puts_capacity_png_beside_an_unchanged_capacity_json(tmp_path: Path) -> None:
    r = report(cliff_search())
    path = write(r, tmp_path / "out")
    assert path == tmp_path / "out" / "capacity.json"
    assert path.read_text() == dumps(r) + "\n"
    png = (tmp_path / "out" / "capacity.png").read_bytes()
    assert png.startswith(PNG) and png_axes_text(png) == png_axes_text(capacity_plot(r))


def test_a_search_over_users_says_users_on_its_axes_and_labels() -> None:
    probes = (row(4.0, 400), row(7.0, 390), row(8.0, 300))
    curve = ((4.0, 1.0), (7.0, 0.975), (8.0, 0.75))
    users = SearchFrame(
        "live", "bracketed", 7.0, (7.0, 8.0), True, None, None, curve, probes, 9.0, "users"
    )
    png = capacity_plot(report(users))
    axes = (png_axes_text(png) or "").split("; ")
    assert axes[0] == (
        "Attainment against closed-loop users: x = closed-loop users (count), "
        "y = attainment (share of requests meeting the SLO)"
    )
    assert axes[1].startswith("Latency against closed-loop users (live probes): x = closed-loop")
    left, _ = figure(report(users)).axes
    assert "live capacity 7 users" in legend(left)
    assert not any("req/s" in t for t in legend(left))


REPLICA_AXES = (
    "Attainment per replica against offered rate (live probes): x = offered rate (req/s), "
    "y = attainment of the replica's requests"
)


def split(p: ProbeRow, slow_met: int | None = None) -> ProbeRow:
    """``p`` over two replicas of 200 requests: ``fast`` takes the hits first."""
    fast = min(p.met, 200)
    slow = p.met - fast if slow_met is None else slow_met
    per = (ReplicaFigures("fast", fast, 200), ReplicaFigures("slow", slow, 200))
    return replace(p, met=fast + slow, replicas=per)


def attributed_search() -> SearchFrame:
    """:func:`cliff_search` over two replicas; 9 req/s probed twice (``slow`` met 190
    and 150 of 200: pooled, 85 %), 12 req/s behind (left out)."""
    s = cliff_search()
    probes = (*(split(p) for p in s.probes), split(s.probes[2], slow_met=150))
    return replace(s, probes=probes)


def test_a_third_panel_draws_each_replicas_attainment_against_the_level() -> None:
    fig = figure(report(attributed_search()))
    assert len(fig.axes) == 3
    ax = fig.axes[2]
    assert legend(ax) == ["fast", "slow", "target 0.95"]
    lines = {line.get_label(): line for line in ax.get_lines()}
    for name, want in (("fast", [1.0, 1.0, 1.0, 0.75]), ("slow", [1.0, 0.99, 0.85, 0.0])):
        assert np.asarray(lines[name].get_xdata()).tolist() == [4.0, 8.0, 9.0, 10.0]
        assert np.asarray(lines[name].get_ydata()).tolist() == pytest.approx(want)
    assert ax.get_ylim()[0] == 0.0


def test_the_png_names_the_third_panels_axes() -> None:
    png = capacity_plot(report(attributed_search()))
    assert png.startswith(PNG)
    assert png_axes_text(png) == (
        f"{ATTAINMENT_AXES}; {LATENCY_AXES}latency (ms, log scale); {REPLICA_AXES}"
    )


def test_without_attribution_the_plot_keeps_two_panels() -> None:
    fig = figure(report(cliff_search()))
    assert len(fig.axes) == 2
    assert "per replica" not in (png_axes_text(capacity_plot(report(cliff_search()))) or "")
    # attribution only at a probe whose generator fell behind: nothing to draw either
    behind = tuple(split(p) if p.behind else p for p in cliff_search().probes)
    assert len(figure(report(replace(cliff_search(), probes=behind))).axes) == 2
