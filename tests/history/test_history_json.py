"""``lbtune history --json``: the text written, checked against golden files first written by
the code before pydantic.

Quirks the JSON form keeps: an entry's ``figures`` last (after ``id``); a drift report's
``current``/``reference`` as a short reference to the entry (id, kind, time, study,
report_dir, config_hash), its computed ``drifted`` names after ``drift``; a check's ``ci``
as ``ci95``; tuples as lists.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from lbtune.cli.history import render_json
from lbtune.history.drift import DriftReport, FigureCheck, check_drift
from lbtune.history.store import Entry
from tests import golden
from tests.history.test_history import _fig, _stress, _study


def entries() -> list[Entry]:
    accepted = replace(
        _study(100.0, _fig(1.0), True, verify=_fig(0.9, records_dir="/r/v", window_start_s=2.0)),
        id=1,
        report_dir="reports/s100",
        config_hash="ab12",
        params={"w": 3, "algo": "leastconn", "on": True, "f": 0.5},
        verdict="improved",
        baseline_trial=0,
        winner_trial=3,
        lbtune_version="0.1.0",
    )
    stress = replace(_stress(200.0, _fig(1.5, degraded=None, error_rate=None)), id=2)
    return [accepted, stress]


def drift() -> list[DriftReport]:
    found = check_drift(entries(), "mixed")
    with_ci = DriftReport(
        "chat",
        entries()[1],
        entries()[0],
        (FigureCheck("p99_e2e_s", 1.5, 1.0, 0.5, 0.2, True, (0.1, 0.4), True),),
        True,
        ("naïve — note",),
    )
    return [found, with_ci, check_drift([], "none")]


def test_history_json_is_the_golden_text() -> None:
    text = render_json(Path("/db/studies.db"), entries(), None)
    assert text == golden.expected("history.json", text)


def test_history_json_with_drift_is_the_golden_text() -> None:
    text = render_json(Path("/db/studies.db"), entries(), drift())
    assert text == golden.expected("history-drift.json", text)
