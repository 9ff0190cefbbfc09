"""``lbtune compare --format json``: the text written, checked against golden files first
written by the code before pydantic.

Quirks the JSON form keeps: ``schema_version`` first and the keys in the order of the
golden files; the computed ``verdict``, ``failed``, ``regressions``, ``improvements`` and
``failures`` (figure keys); a side's ``records`` (whether it had per-request records) in
place of its arrays, and its ``slo`` pair as ``{"ttft_s", "e2e_s"}``; NaN and infinities
as ``null``; tuples as lists.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from lbtune.compare.verdict import CompareResult, FigureChange, Side, compare
from lbtune.metrics.bootstrap import RunArrays
from lbtune.metrics.summary import Window
from lbtune.report.compare import render_json
from tests import golden
from tests.compare.test_verdict import T0, records

FIGS = {
    "ttft_p50": 0.08,
    "ttft_p99": 0.25,
    "e2e_p99": 1.5,
    "itl_p50": None,
    "requests_per_s": 19.5,
    "output_tokens_per_s": 780.0,
    "goodput_per_s": 19.0,
    "error_rate": 0.0,
}


def sides() -> tuple[Side, Side]:
    arrays = RunArrays.from_records(records(n=60), Window(T0, T0 + 30))
    a = Side(
        "A", "a (stress, chat)", "/r/a", "stress", "chat", FIGS, arrays, requests=60,
        slo=(0.35, None), notes=("60 successful requests in the window: P99s rest on …",),
    )  # fmt: skip
    b_figs = FIGS | {"e2e_p99": 2.25, "error_rate": 0.01, "ttft_p50": math.nan}
    b = Side("B", "study s: winner (trial 3, confirmed)", "/r/b", "study", "chat", b_figs, runs=2)
    return a, b


def results() -> dict[str, CompareResult]:
    a, b = sides()
    changes = (
        FigureChange(
            "e2e_p99", "P99 E2E", "ms", "lower", True, 1.5, 2.25, 0.5, (0.3, 0.7),
            "regression", threshold=0.1, failed=True,
        ),
        FigureChange(
            "error_rate", "error rate", "%", "lower", False, 0.0, 0.01, 0.01, (0.0, math.inf),
            "noise", threshold=0.01,
        ),
        FigureChange(
            "requests_per_s", "throughput", "req/s", "higher", True, 19.5, 21.0, 0.0769,
            (0.01, 0.1), "improvement",
        ),
        FigureChange(
            "ttft_p50", "P50 TTFT", "ms", "lower", True, 0.08, None, None, None, "untested",
            note="missing on one side (too few samples for this percentile, see docs/metrics.md)",
        ),
    )  # fmt: skip
    built = CompareResult(
        a, b, changes, 0.95, 2000, 7, {"e2e_p99": 0.1, "error_rate": 0.01}, ("A: …", "B: ✓")
    )
    untested = compare(replace(a, arrays=None), b, seed=3)
    return {"built": built, "untested": untested}


@pytest.mark.parametrize("name", ["built", "untested"])
def test_compare_json_is_the_golden_text(name: str) -> None:
    text = render_json(results()[name])
    assert text == golden.expected(f"compare-{name}.json", text)
