"""write_report(): summary.json round-trips, report.md has the figures, report.html is alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lbtune.errors import ConfigError
from lbtune.metrics.summary import SCHEMA_VERSION, GeneratorHealth, RunSummary
from lbtune.metrics.summary_file import read_summary
from lbtune.report import write_report
from lbtune.report.markdown import fmt
from tests.report import data


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunSummary, Path]:
    summary = data.summary(
        generator=GeneratorHealth(degraded=True, reasons=("CPU 97 % > 90 %",)),
        notes=("Prometheus at http://127.0.0.1:9090 is unreachable after 12 s",),
        incomplete=True,
    )
    out = tmp_path_factory.mktemp("report") / "run"
    paths = write_report(out, summary, data.records())
    assert paths.directory == out
    return summary, out


def test_summary_json_round_trips(written: tuple[RunSummary, Path]) -> None:
    summary, out = written
    assert read_summary(out / "summary.json") == summary
    raw = json.loads((out / "summary.json").read_text())
    assert raw["schema_version"] == SCHEMA_VERSION and raw["incomplete"] is True
    assert raw["latency"]["ttft"]["p99"] == pytest.approx(summary.latency.ttft.p99)
    assert raw["outcomes"]["counts"]["http_error"] == 3


def test_markdown_leads_with_warnings_and_holds_key_figures(
    written: tuple[RunSummary, Path],
) -> None:
    summary, out = written
    md = (out / "report.md").read_text()
    lines = md.splitlines()
    assert lines[0] == "# lbtune report: ramp"
    assert lines[2].startswith("> **⚠ DEGRADED") and "CPU 97 %" in lines[2]
    assert "INCOMPLETE" in md.split("## Summary")[0]
    ttft = summary.latency.ttft
    assert ttft.p50 is not None and ttft.p99 is not None
    assert f"| TTFT P50 | {fmt(ttft.p50 * 1000)} | ms |" in md
    assert f"| TTFT P99 | {fmt(ttft.p99 * 1000)} | ms |" in md
    assert f"| Throughput | {fmt(summary.throughput.requests_per_s)} | req/s |" in md
    assert "| r2 | 94 |" in md  # per-replica table
    assert "| error_rate |" in md and "FAIL" in md
    assert "## Stages" in md and "## Cross-check" in md
    assert "unreachable after 12 s" in md
    assert "Replica balance: std-dev 0.245 of SM activity (sm_active)." in md


def test_html_is_self_contained_with_plots(written: tuple[RunSummary, Path]) -> None:
    _, out = written
    page = (out / "report.html").read_text()
    assert page.count('<img src="data:image/png;base64,') >= 4
    assert "http://" not in page and "https://" not in page
    # Every src/href is inline data; no stylesheet or script is loaded from anywhere.
    assert re.findall(r'(?:src|href)="(?!data:)', page) == []
    assert "<script" not in page and "@import" not in page and "url(" not in page
    assert page.index("DEGRADED") < page.index("<h2>Plots</h2>")
    assert "127.0.0.1:9090" in page  # shown as text, scheme written with entities


def test_empty_run_still_renders(tmp_path: Path) -> None:
    from lbtune.metrics.stats import summarize

    s = summarize([], run_start=data.T0, window=data.WINDOW, scenario="chat", target="t")
    paths = write_report(tmp_path, s, [])
    page = paths.report_html.read_text()
    assert page.count("data:image/png;base64,") == 4
    assert "no request was sent" in paths.report_md.read_text()


def test_read_summary_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "summary.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match=r"summary\.json: not valid JSON"):
        read_summary(bad)
    with pytest.raises(ConfigError, match="no such summary file"):
        read_summary(tmp_path / "missing.json")
