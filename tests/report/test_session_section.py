"""The reports' "Agent sessions" section: shown with its figures only when the summary has
session figures (``summary.sessions``)."""

from __future__ import annotations

import dataclasses

import pytest

from lbtune.metrics.summary import RunSummary, SessionStats
from lbtune.records.quantiles import latency_stats
from lbtune.report import frame, html, markdown
from tests.report import data

SESSIONS = SessionStats(
    started=12,
    completed=10,
    failed=1,
    unfinished=1,
    completion=latency_stats([4.0 + 0.5 * k for k in range(10)]),
    in_cluster=latency_stats([1.5 + 0.25 * k for k in range(10)]),
    waiting=latency_stats([2.5 + 0.25 * k for k in range(10)]),
    in_cluster_share=0.4,
    calls_mean=5.5,
    same_replica_share=0.75,
)


@pytest.fixture(scope="module")
def plain() -> RunSummary:
    return data.summary()


def test_the_session_table_holds_the_figures_with_units(plain: RunSummary) -> None:
    assert frame.session_table(plain).rows == ()
    t = frame.session_table(dataclasses.replace(plain, sessions=SESSIONS))
    rows = {r[0]: (r[1], r[2]) for r in t.rows}
    units = {str(r[0]): r[2] for r in t.rows}
    values = {r[0]: r[1] for r in t.rows}
    assert rows["Sessions started (window)"] == (12, "")
    assert rows["Completed"] == (10, "")
    assert rows["Failed"] == (1, "") and rows["Unfinished (run ended first)"] == (1, "")
    assert values["Completion time P50"] == pytest.approx(6250.0)
    assert values["Completion time P90"] == pytest.approx(8050.0)
    assert rows["Completion time P99"] == (None, "ms")  # 10 sessions: too few for a P99
    assert values["In the cluster P50"] == pytest.approx(2625.0)
    assert values["Waiting P50"] == pytest.approx(3625.0)
    assert values["Time in the cluster"] == pytest.approx(40.0)
    assert rows["Calls per session"] == (5.5, "calls")
    assert values["Same replica as first call"] == pytest.approx(75.0)
    times = [k for k in units if k.startswith(("Completion", "In the cluster", "Waiting"))]
    assert len(times) == 5 and {units[k] for k in times} == {"ms"}
    assert units["Time in the cluster"] == units["Same replica as first call"] == "%"


def test_markdown_and_html_show_the_section_only_when_set(plain: RunSummary) -> None:
    with_sessions = dataclasses.replace(plain, sessions=SESSIONS)
    md = markdown.render(with_sessions)
    assert "## Agent sessions" in md
    assert "| Completion time P50 | 6,250 | ms |" in md
    assert "| Same replica as first call | 75.0 | % |" in md
    assert md.index("## Stages") < md.index("## Agent sessions") < md.index("## Server side")
    assert "Agent sessions" not in markdown.render(plain)
    records = data.records()
    page = html.render(with_sessions, records)
    assert "<h2>Agent sessions</h2>" in page and "Completion time P90" in page
    assert "Agent sessions" not in html.render(plain, records)
