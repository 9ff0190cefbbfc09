"""``capacity.json`` and the text report with figures per replica: the JSON reads back
whole (and a file from before the field still reads), and the text shows the table of the
probe nearest the capacity."""

from __future__ import annotations

import json
from dataclasses import replace

from pydantic import TypeAdapter

from lbtune.capacity.frame import CapacityReport, SearchFrame
from lbtune.capacity.replicas import ReplicaFigures
from lbtune.capacity.report import describe, describe_replicas, dumps
from tests.capacity.test_plot import cliff_search, report

ADAPTER = TypeAdapter(CapacityReport)
FAST = ReplicaFigures("sim-0", 198, 200, 1, 0.1, 0.3, 0.02, 0.05)
SLOW = ReplicaFigures("sim-1", 150, 200, 0, 0.4, 2.5, 0.06, None)


def attributed() -> SearchFrame:
    """:func:`cliff_search` (capacity 9.04 req/s) with figures per replica at 8 and 9 req/s
    (one fast, one slow replica)."""
    s = cliff_search()
    per = {8.0: (FAST, replace(SLOW, met=190)), 9.0: (FAST, SLOW)}
    probes = tuple(
        replace(p, replicas=per.get(p.rate, ()), run_dir=f"out/probe-0{i}-{p.rate:g}rps")
        for i, p in enumerate(s.probes)
    )
    return replace(s, probes=probes)


def test_the_json_round_trips_with_figures_per_replica() -> None:
    r = report(attributed())
    back = ADAPTER.validate_json(dumps(r))
    assert back == r
    assert back.live is not None and back.live.probes[2].replicas == (FAST, SLOW)
    doc = json.loads(dumps(r))
    assert doc["live"]["probes"][2]["replicas"][1] == {
        "replica": "sim-1",
        "met": 150,
        "judged": 200,
        "unjudged": 0,
        "ttft_p50": 0.4,
        "ttft_p99": 2.5,
        "tpot_p50": 0.06,
        "tpot_p99": None,
    }


def test_a_file_written_before_the_field_still_reads() -> None:
    r = report(cliff_search())
    doc = json.loads(dumps(r))
    for p in doc["live"]["probes"]:
        del p["replicas"]
    back = ADAPTER.validate_json(json.dumps(doc))
    assert back == r and back.live is not None
    assert all(p.replicas == () for p in back.live.probes)


def test_the_text_shows_the_replicas_of_the_probe_nearest_the_capacity() -> None:
    lines = describe(report(attributed()))
    at = lines.index(
        "per replica at the live probe of 9 req/s (nearest the capacity; probe-02-9rps):"
    )
    assert lines[at + 1 : at + 5] == [
        "  replica  judged  attained  TTFT p99  TPOT p99",
        "  sim-0       200    99.00%     300ms      50ms",
        "  sim-1       200    75.00%      2.5s         -",
        "  (-: too few samples on that replica for a P99, which needs 100)",
    ]


def test_without_attribution_there_is_no_table() -> None:
    lines = describe(report(cliff_search()))
    assert not any(line.startswith("per replica") for line in lines)
    assert describe_replicas(cliff_search(), 0.95) == []


def test_without_a_capacity_the_highest_probe_meeting_the_target_is_shown() -> None:
    below = replace(attributed(), kind="above", capacity=None, ci=None)
    (head, *_) = describe_replicas(below, 0.95)
    assert head.startswith("per replica at the live probe of 9 req/s (highest meeting the")
    none_met = replace(below, kind="below")
    (head, *_) = describe_replicas(none_met, 0.999)
    assert head.startswith("per replica at the live probe of 8 req/s (none met the target")
