"""`lbtune history` — every stress run and study over time, and drift of the live config."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from lbtune.cli.options import JsonOpt

if TYPE_CHECKING:
    from lbtune.history.drift import DriftReport
    from lbtune.history.store import Entry


def history_command(
    scenario: str | None = typer.Option(
        None, "--scenario", "-s", help="Only this scenario (a name, or its YAML file)."
    ),
    last: int | None = typer.Option(None, "--last", "-n", help="Only the newest N entries."),
    as_json: JsonOpt = False,
    html_path: Path | None = typer.Option(
        None, "--html", help="Also write a self-contained HTML page with plots to this path."
    ),
    check_drift: bool = typer.Option(
        False,
        "--check-drift",
        help="Compare the newest run of each scenario with the last accepted study: exit 1 "
        "when it is significantly worse.",
    ),
    threshold: float = typer.Option(
        0.20, "--threshold", help="Drift: relative change counted as worse (0.2 = 20 %)."
    ),
    storage: str | None = typer.Option(
        None,
        "--storage",
        help="The studies database (sqlite:///path or a path; default: $LBTUNE_HISTORY_DB, "
        "else reports/studies.db).",
    ),
) -> None:
    """Show indexed stress runs and studies over time, and flag drift.

    Every `lbtune stress` that writes a report and every `lbtune optimize` is indexed in the
    studies database. Figures shown are what each measured of the live config (a study's
    baseline trial); an accepted study is one whose winner was rolled out and verified.

    --json prints the entries (and, with --check-drift, the drift reports) as JSON.

    Example: lbtune history --scenario mixed --last 20 --html history.html --check-drift
    """
    from lbtune.errors import ConfigError
    from lbtune.history import DEFAULT_STORAGE, db_path
    from lbtune.history.drift import check_drift as drift_of
    from lbtune.history.store import HistoryStore

    _check(threshold, last, html_path)
    if storage is not None and "://" not in storage:
        storage = f"sqlite:///{storage}"
    path = db_path(storage, use_env=False) if storage is not None else db_path(DEFAULT_STORAGE)
    if path is None:
        raise ConfigError(f"--storage {storage}: an in-memory database keeps no history")
    store = HistoryStore(path)
    if scenario is not None and scenario.endswith((".yaml", ".yml")):
        from lbtune.scenario import load_scenario

        scenario = load_scenario(scenario).name  # runs are indexed by the scenario's name
    entries = store.entries(scenario, last)
    drift: list[DriftReport] = []
    if check_drift or html_path is not None:
        names = [scenario] if scenario else store.scenarios()
        drift = [drift_of(store.entries(n), n, threshold=threshold) for n in names]
    if html_path is not None:
        from lbtune.history.page import page

        html_path.parent.mkdir(parents=True, exist_ok=True)
        html_path.write_text(page(entries, drift), encoding="utf-8")
        typer.echo(f"history page: {html_path}", err=True)
    if as_json:
        sys.stdout.write(render_json(path, entries, drift if check_drift else None))
    else:
        _print(entries, drift if check_drift else [])
    if check_drift and any(d.drift for d in drift):
        raise typer.Exit(1)


def render_json(db: Path, entries: list[Entry], drift: list[DriftReport] | None) -> str:
    """``--json``: the database, its entries and (``drift`` not None) the drift reports."""
    from lbtune.history.drift import DRIFT
    from lbtune.history.store import ENTRY
    from lbtune.records.jsonform import json_data

    doc: dict[str, object] = {"db": str(db), "entries": [json_data(ENTRY, e) for e in entries]}
    if drift is not None:
        doc["drift"] = [json_data(DRIFT, d) for d in drift]
        doc["drift_detected"] = any(d.drift for d in drift)
    return json.dumps(doc, indent=2, default=str) + "\n"


def _print(entries: list[Entry], drift: list[DriftReport]) -> None:
    from rich.console import Console
    from rich.table import Table

    from lbtune.history.page import COLUMNS, rows

    out = Console()
    out = out if out.is_terminal else Console(width=200)
    table = Table(title=f"History ({len(entries)} entries, oldest first)")
    for col in COLUMNS:
        table.add_column(col, overflow="fold")
    for r in rows(entries):
        table.add_row(*(r[c] for c in COLUMNS))
    out.print(table)
    for d in drift:
        out.print(_drift_line(d), highlight=False, markup=False)


def _drift_line(d: DriftReport) -> str:
    if d.reference is None or not d.checks:
        return f"drift {d.scenario}: not checked ({'; '.join(d.notes)})"
    parts = []
    for c in d.checks:
        if c.change is None:
            continue
        text = (
            f"{c.name} {c.change:+.1%}" if c.name != "error_rate" else f"{c.name} {c.change:+.2%}"
        )
        if c.ci is not None:
            text += f" (CI {c.ci[0] * 1000:+.0f}..{c.ci[1] * 1000:+.0f} ms)"
        parts.append(text + (" DRIFT" if c.drifted else ""))
    ref = d.reference.study or d.reference.report_dir
    head = "DRIFT" if d.drift else "no drift"
    notes = f" (note: {'; '.join(d.notes)})" if d.notes else ""
    return f"drift {d.scenario}: {head} vs accepted {ref}: {', '.join(parts)}{notes}"


def _check(threshold: float, last: int | None, html_path: Path | None) -> None:
    """The options' bounds, before anything is read."""
    from lbtune.errors import ConfigError

    if not 0 < threshold <= 100:
        raise ConfigError(f"--threshold: must be > 0 and at most 100 (10000 %), got {threshold}")
    if last is not None and not 1 <= last <= 10**9:
        raise ConfigError(f"--last: must be 1..1000000000, got {last}")
    if html_path is not None:
        from lbtune.safety.files import check_out_file

        check_out_file(html_path, "--html")
