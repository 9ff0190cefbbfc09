"""The study report's screening section: how many configs the twin screened, and each
live trial's measured figures beside the twin's prediction of them."""

from __future__ import annotations

from lbtune.report.frame import Cell, Table
from lbtune.report.markdown import table as md_table
from lbtune.search.result import Screening

__all__ = ["screening_markdown", "screening_table"]


COLUMNS = (
    "trial",
    "role",
    "score (twin)",
    "score (live)",
    "P99 E2E s (twin)",
    "P99 E2E s (live)",
    "req/s (twin)",
    "req/s (live)",
)


def screening_table(s: Screening) -> Table:
    """A row per completed live trial: the twin's prediction and the live measurement."""
    rows: list[tuple[Cell, ...]] = [
        (
            r.trial,
            r.role,
            r.predicted,
            r.measured,
            r.predicted_p99_e2e_s,
            r.measured_p99_e2e_s,
            r.predicted_rps,
            r.measured_rps,
        )
        for r in s.rows
    ]
    return Table(COLUMNS, tuple(rows))


def screening_markdown(s: Screening | None) -> list[str]:
    """The section's lines (none without a screening)."""
    if s is None:
        return []
    rho = "—" if s.rank_corr is None else f"{s.rank_corr:.2f}"
    lines = [
        "## Screening in the twin",
        "",
        f"{s.screened} configs screened in the virtual-time twin ({s.window_s:g} virtual s "
        f"each, {s.wall_s:.0f} s wall, {s.cpu_s:.0f} CPU s); the best {s.sent_live} went live. "
        f"Each live trial's config simulated on the live trials' plan ({s.live_window_s:g} "
        "virtual s) beside its measurement. Rank agreement of the twin's and the live "
        f"scores (Spearman): {rho}.",
        "",
    ]
    if s.rows:
        lines += [md_table(screening_table(s)), ""]
    if s.note:
        lines += [s.note, ""]
    return lines
