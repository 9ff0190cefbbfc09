"""What a reader of the stress report sees: labelled axes, the plots that fit the run, units."""

from __future__ import annotations

import dataclasses
import re

from lbtune.metrics.summary import CrossCheck, QuantileCheck
from lbtune.report import frame, html, plots, series
from tests.report import data


def _alts(page: str) -> list[str]:
    return re.findall(r'<img src="data:image/png;base64,[^"]*" alt="([^"]*)"', page)


def test_every_plot_names_its_axes_in_its_alt_text() -> None:
    page = html.render(data.summary(), data.records())
    alts = _alts(page)
    assert len(alts) == 4
    for alt in alts:
        assert "x = " in alt and "y = " in alt, alt
        assert "(none)" not in alt, alt
    latency = next(a for a in alts if a.startswith("latency:"))
    assert "y = TTFT (ms)" in latency and "y = E2E (ms)" in latency  # one panel each


def test_axes_text_reads_a_missing_label_as_none() -> None:
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1])
    ax.set_xlabel("s")
    assert plots.axes_text(fig) == "plot: x = s, y = (none)"
    assert plots.png_axes_text(plots._png(fig)) == "plot: x = s, y = (none)"


def test_stages_get_the_offered_load_curve_one_stage_gets_throughput_over_time() -> None:
    staged = html.render_plots(data.summary(), data.records())
    assert "throughput" in staged and "throughput_time" not in staged
    single = html.render_plots(data.summary(stages=()), data.records())
    assert "throughput_time" in single and "throughput" not in single
    over_time = series.throughput_over_time(data.records(), data.T0)
    assert sum(p.completed_per_s for p in over_time) == 300  # every ok request, once


def test_ttft_caption_promises_only_the_lines_it_draws() -> None:
    s = data.summary()
    assert "P50 and P99 and the SLO" in html.ttft_caption(s)
    few = dataclasses.replace(
        s,
        latency=dataclasses.replace(
            s.latency, ttft=dataclasses.replace(s.latency.ttft, p99=None, count=40)
        ),
    )
    text = html.ttft_caption(few)
    assert "P99 and" not in text and "No P99 line: 40 samples" in text


def test_knee_and_stage_load_carry_a_unit() -> None:
    s = data.summary()
    head = {r[0]: r for r in frame.headline(s).rows}
    assert head["Knee (offered load)"][2] == "users"
    assert "Offered load (users)" in frame.stage_table(s).columns


def test_crosscheck_shows_the_summary_figure_when_it_could_not_compare() -> None:
    s = data.summary()
    q = QuantileCheck("ttft_p50", None, 0.05, None, None, "too few samples (40) to compare")
    cc = dataclasses.replace(s, cross_check=CrossCheck(quantiles=(q,)))
    (row,) = frame.crosscheck_table(cc).rows
    assert row[1] == frame.ms(s.latency.ttft.p50) and row[1] is not None
    assert row[3] == "too few samples (40) to compare" and row[4] == "n/a"


def test_verdict_says_what_the_figures_mean() -> None:
    s = data.summary()
    text = frame.verdict(s)
    assert text.startswith("Verdict: SLO ")
    assert "req/s served" in text and "first token within" in text
    few = dataclasses.replace(
        s,
        latency=dataclasses.replace(
            s.latency, e2e=dataclasses.replace(s.latency.e2e, p99=None, count=40)
        ),
    )
    assert "no P99 yet: 40 requests in the window, 100 needed" in frame.verdict(few)
    assert frame.verdict(s) in html.render(s, data.records())


def test_a_verdict_says_which_slo_was_not_set() -> None:
    """Round robin at an 11 s P99 with no E2E SLO in the scenario is not "SLO met"."""
    from lbtune.metrics.summary import SloCheck

    s = data.summary()
    ttft = SloCheck("p99_ttft", 1.0, 0.4, True)
    e2e = SloCheck("p99_e2e", 20.0, 11.0, True)
    errors = SloCheck("error_rate", 0.01, 0.0, True)
    no_e2e = dataclasses.replace(s, slo_checks=(ttft, errors))
    assert frame.verdict(no_e2e).startswith("Verdict: SLO met for TTFT and errors; no E2E SLO set.")
    only_errors = dataclasses.replace(s, slo_checks=(errors,))
    assert "SLO met for errors; no TTFT or E2E SLO set" in frame.verdict(only_errors)
    every = dataclasses.replace(s, slo_checks=(ttft, e2e, errors))
    assert frame.verdict(every).startswith("Verdict: SLO met. ")
    failed = dataclasses.replace(s, slo_checks=(dataclasses.replace(e2e, ok=False), errors))
    assert frame.verdict(failed).startswith("Verdict: SLO NOT met (p99_e2e)")
