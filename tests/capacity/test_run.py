"""The search end to end on hand-made probes: the twin's search places the live bracket,
and the report says how far apart the two capacities were."""

from __future__ import annotations

import json
from pathlib import Path

from lbtune.capacity.report import describe
from lbtune.capacity.run import CapacityOptions, measure
from lbtune.capacity.search import SearchOptions
from lbtune.records.slo import Slo
from lbtune.run.stress import StressOptions
from tests.capacity.curves import CurveProbe, logistic


def test_the_twin_places_the_live_bracket_and_its_error_is_reported(tmp_path: Path) -> None:
    twin = CurveProbe(logistic(22.0, 0.99, width=1.0), n=5000, source="twin")  # says 22
    live = CurveProbe(logistic(20.0, 0.99, width=1.0), n=5000)  # the cluster serves 20
    opts = CapacityOptions(
        StressOptions(scenario="chat"),
        Slo(ttft_s=1.0),
        tmp_path,
        SearchOptions(attainment=0.99, precision=0.1),
        twin_margin=0.2,
    )
    report = measure(opts, live, twin)
    assert report.twin is not None and report.live is not None
    assert report.twin.capacity is not None and report.live.capacity is not None
    t = report.twin.capacity
    assert live.rates[:2] == [t * 0.8, t * 1.2]  # the live search started at the bracket
    assert report.live.converged and report.live.ci is not None
    assert report.twin_error is not None
    assert report.twin_error == (t - report.live.capacity) / report.live.capacity
    assert 0.03 < report.twin_error < 0.17
    assert all(p.source == "twin" for p in report.twin.probes)
    assert any(line.startswith("twin: its capacity was +") for line in describe(report))
    saved = json.loads((tmp_path / "capacity.json").read_text())
    assert saved["twin_error"] == report.twin_error


def test_the_twin_search_is_not_held_to_the_live_probe_budget(tmp_path: Path) -> None:
    twin = CurveProbe(logistic(30.0, 0.99, width=1.0), n=5000, source="twin")
    live = CurveProbe(logistic(30.0, 0.99, width=1.0), n=5000)
    opts = CapacityOptions(
        StressOptions(scenario="chat"),
        Slo(ttft_s=1.0),
        tmp_path,
        SearchOptions(attainment=0.99, precision=0.05, max_probes=4),
    )
    report = measure(opts, live, twin)
    assert report.twin is not None and report.twin.converged
    assert len(report.twin.probes) > 4 and len(live.rates) <= 4
