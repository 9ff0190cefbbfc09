"""The run report: ``summary.json``, ``report.md`` and a self-contained ``report.html``.

:mod:`lbtune.report.frame` computes the tables and plot data (pure, tested);
:mod:`~lbtune.metrics.summary_file`, :mod:`~lbtune.report.markdown`, :mod:`~lbtune.report.html`
and :mod:`~lbtune.report.plots` only format it. Importing this package is light:
matplotlib is imported when a report is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lbtune.metrics.summary_file import write_summary
from lbtune.report import html, markdown
from lbtune.safety.secrets import scrub

if TYPE_CHECKING:
    from lbtune.metrics.summary import RunSummary
    from lbtune.records.requests import RequestRecord


@dataclass(frozen=True)
class ReportPaths:
    directory: Path
    summary_json: Path
    report_md: Path
    report_html: Path


def write_report(
    out_dir: Path | str, summary: RunSummary, records: Sequence[RequestRecord]
) -> ReportPaths:
    """Write ``summary.json``, ``report.md`` and ``report.html`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = ReportPaths(out, out / "summary.json", out / "report.md", out / "report.html")
    write_summary(paths.summary_json, summary)
    # No secret of this process in a report (summary.json: json_text scrubs its strings).
    paths.report_md.write_text(scrub(markdown.render(summary)), encoding="utf-8")
    paths.report_html.write_text(scrub(html.render(summary, records)), encoding="utf-8")
    return paths
