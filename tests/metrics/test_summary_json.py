"""``summary.json`` (the CI contract, docs/summary-schema.md): the text written and what is
read back, checked against golden files first written by the code before pydantic.

Quirks the JSON form keeps: a figure that is NaN or infinite is ``null``; tuples are lists;
keys in field order; a file without a field added later (``replica_events``,
``balancer_errors``, ``sm_active``, ...) reads with that field's default.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

from lbtune.errors import ConfigError
from lbtune.metrics.summary import (
    CountCheck,
    CrossCheck,
    GeneratorHealth,
    QuantileCheck,
    ReplicaEvents,
    ReplicaOutage,
    RunSummary,
)
from lbtune.metrics.summary_file import dumps, read_summary, summary_from_data, write_summary
from tests import golden
from tests.report import data

LEGACY_DROPS = ("replica_events", "lbtune_version", "sessions")
"""Top-level fields a summary from an older lbtune lacks."""
LEGACY_REPLICA_DROPS = ("balancer_errors", "too_few_samples")
LEGACY_GENERATOR_DROPS = ("idle_share", "ttft_bound_p50_s", "ttft_bound_p99_s", "timing")


def summaries() -> dict[str, RunSummary]:
    """A full run (3 stages, server side, SLO); the same with replica events, non-finite
    figures and non-ASCII notes; a single-stage run without server side or SLO."""
    gen = GeneratorHealth(lateness_p99_s=0.001, loop_lag_p99_s=0.002, cpu_max_percent=41.0)
    # Seconds as a run has them (floats: a float field holding an int would be written 10.0).
    stages = tuple(replace(s, start_s=float(s.start_s), end_s=float(s.end_s)) for s in data.STAGES)
    full = data.summary(generator=gen, stages=stages)
    events = ReplicaEvents(
        known=True,
        source="haproxy",
        samples=40,
        outages=(
            ReplicaOutage("r1", "DOWN", 4.5, 120, up_s=9.25, trouble_s=4.0),
            ReplicaOutage("r2", "MAINT", 20.0, 250),
        ),
        unattributed=2,
        unattributed_reason="2: several replicas of m were down or failing (r1, r2)",
    )
    cross = CrossCheck(
        counts=(
            CountCheck("ok", 297, 295.0, 0.01, True),
            CountCheck("timeout", 0, None, 0.0, None),
        ),
        quantiles=(QuantileCheck("ttft_p99", 0.25, 0.26, 0.05, True, "within …", 0.2, 0.3),),
        agree=True,
        notes=("ttft_p50: 1e-05 s",),
    )
    odd = replace(
        full,
        replica_events=events,
        cross_check=cross,
        throughput_decay=math.nan,
        knee_offered_load=math.inf,
        recovery_s=-math.inf,
        incomplete=True,
        notes=("Prometheus unreachable after 12 s (…)", "naïve — ok", 'quote " and \\'),
        lbtune_version="0.1.0",
    )
    minimal = data.summary(stages=(), server=None, slo=None, generator=GeneratorHealth())
    return {"full": full, "odd": odd, "minimal": minimal}


def legacy(text: str) -> dict[str, Any]:
    """A summary as an older lbtune wrote it: without the fields added since."""
    doc: dict[str, Any] = json.loads(text)
    for key in LEGACY_DROPS:
        del doc[key]
    for r in doc["replicas"]:
        for key in LEGACY_REPLICA_DROPS:
            del r[key]
    for key in LEGACY_GENERATOR_DROPS:
        del doc["generator"][key]
    for r in doc["server"]["replicas"]:
        del r["sm_active"]
    return doc


@pytest.mark.parametrize("name", ["full", "odd", "minimal"])
def test_summary_json_is_the_golden_text(name: str) -> None:
    text = dumps(summaries()[name])
    assert text == golden.expected(f"summary-{name}.json", text)


@pytest.mark.parametrize("name", ["full", "odd", "minimal"])
def test_a_summary_reads_back_as_before(name: str) -> None:
    """What the golden file reads back as (its repr: types included, 41.0 not 41)."""
    back = summary_from_data(json.loads(golden.read(f"summary-{name}.json")))
    assert repr(back) + "\n" == golden.expected(f"summary-{name}.read.txt", repr(back) + "\n")
    if name != "odd":  # NaN and infinities come back as None
        assert back == summaries()[name]


def test_a_summary_without_the_newer_fields_reads_with_their_defaults() -> None:
    back = summary_from_data(legacy(golden.read("summary-full.json")))
    assert repr(back) + "\n" == golden.expected("summary-legacy.read.txt", repr(back) + "\n")
    assert back.replica_events is None and back.lbtune_version == "" and back.sessions is None
    assert all(r.balancer_errors == 0 for r in back.replicas)


def test_unknown_fields_are_ignored() -> None:
    doc = json.loads(golden.read("summary-full.json"))
    doc["added_later"] = {"x": 1}
    doc["window"]["extra"] = 1
    assert summary_from_data(doc) == summaries()["full"]


def test_write_and_read_a_file(tmp_path: Any) -> None:
    s = summaries()["full"]
    path = write_summary(tmp_path / "summary.json", s)
    assert path.read_text(encoding="utf-8") == golden.read("summary-full.json")
    assert read_summary(path) == s


def test_a_malformed_summary_is_one_config_error(tmp_path: Any) -> None:
    doc = json.loads(golden.read("summary-full.json"))
    del doc["window"]
    with pytest.raises(ConfigError, match=r"summary is malformed: .*window"):
        summary_from_data(doc)
    doc = json.loads(golden.read("summary-full.json"))
    doc["outcomes"]["sent"] = "many"
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=f"{path}: summary is malformed: outcomes.sent"):
        read_summary(path)
    for version in (99, None, "1"):
        doc["schema_version"] = version
        with pytest.raises(ConfigError, match="schema_version"):
            summary_from_data(doc)
