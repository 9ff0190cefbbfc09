"""Every P50/P99 that lbtune writes, recomputed from ``requests.parquet`` and the window.

Two short open-loop runs against the embedded mini2 cluster, streamed and non-streamed
requests mixed, in two load steps, with an SLO. The recomputation here is independent
of lbtune's metrics code: it reads the parquet file with pyarrow, applies the
definitions of ``docs/metrics.md`` (requests sent in ``[start, end)``; TTFT over
streamed requests; linear percentiles; the minimum sample counts) with numpy, and
expects every figure of ``summary.json`` — latency table, per replica, per stage, SLO
checks, cross-check — and of ``lbtune compare --format json`` to be exactly equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.conftest import running_cluster

pytestmark = pytest.mark.integration

MIN_SAMPLES = {"p50": 2, "p90": 10, "p95": 20, "p99": 100, "p999": 1000}
"""docs/metrics.md, restated here so that the test does not read lbtune's own table."""
QS = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}

SCENARIO = """\
name: recompute
description: Open-loop steps, 70 % streamed, for the recomputation test.
seed: {seed}
warmup_s: 1
cooldown_s: 2
slo: {{ttft: 1s, e2e: 5s}}
load:
  type: steps
  arrival: poisson
  steps:
    - {{rate: 10, duration: 7}}
    - {{rate: 18, duration: 7}}
api: chat
models: {{llama-3.1-8b-instruct: 1}}
prompt_tokens: {{type: lognormal, median: 60, sigma: 0.5, min: 8, max: 256}}
output_tokens: {{type: lognormal, median: 24, sigma: 0.5, min: 4, max: 96}}
stream: 0.7
"""


def _lbtune(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lbtune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Path]]:
    """Two 14 s runs (seeds 1 and 2); their report directories."""
    base = tmp_path_factory.mktemp("recompute")
    out: list[Path] = []
    with running_cluster(base / "cluster", time_scale=8.0) as ep:
        for seed in (1, 2):
            scen = base / f"recompute-{seed}.yaml"
            scen.write_text(SCENARIO.format(seed=seed))
            report = base / f"run-{seed}"
            proc = _lbtune(
                "stress",
                "--scenario",
                str(scen),
                "--duration",
                "14",
                "--state-dir",
                str(ep.state_dir),
                "--out",
                str(report),
                "--json",
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            out.append(report)
    yield out


# --- the independent recomputation ---------------------------------------------------


def _records(report: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(report / "requests.parquet").to_pylist()
    return rows


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q, method="linear"))


def _reported(values: list[float], name: str) -> float | None:
    return _pct(values, QS[name]) if len(values) >= MIN_SAMPLES[name] else None


def _p99_or_max(values: list[float]) -> float | None:
    if not values:
        return None
    return _pct(values, 99.0) if len(values) >= 100 else max(values)


def _ttft(r: dict[str, Any]) -> float | None:
    if not r["stream"] or r["first_token_at"] is None:
        return None
    return float(r["first_token_at"] - r["sent_at"])


def _samples(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Every latency of the latency table over ``rows`` (already the window's)."""
    ok = [r for r in rows if r["outcome"] == "ok"]
    sched = [r for r in ok if r["scheduled_at"] is not None]
    return {
        "ttft": [t for r in ok if (t := _ttft(r)) is not None],
        "itl": [b - a for r in ok for a, b in pairwise(r["chunk_times"])],
        "tpot": [
            (r["ended_at"] - r["first_token_at"]) / (r["output_tokens"] - 1)
            for r in ok
            if r["stream"] and r["first_token_at"] is not None and (r["output_tokens"] or 0) >= 2
        ],
        "e2e": [r["ended_at"] - r["sent_at"] for r in ok],
        "ttft_from_schedule": [
            r["first_token_at"] - r["scheduled_at"]
            for r in sched
            if r["first_token_at"] is not None
        ],
        "e2e_from_schedule": [r["ended_at"] - r["scheduled_at"] for r in sched],
    }


def _sent_in(rows: list[dict[str, Any]], start: float, end: float) -> list[dict[str, Any]]:
    return [r for r in rows if start <= r["sent_at"] < end]


def _assert_stats(got: dict[str, Any], values: list[float], what: str) -> None:
    assert got["count"] == len(values), what
    for name in QS:
        assert got[name] == _reported(values, name), f"{what} {name}"
    if values:
        assert (got["min"], got["max"]) == (min(values), max(values)), what


def _window(report: Path, summary: dict[str, Any]) -> tuple[float, float]:
    """The recorded window: summary.json's, which run.json (where written) must repeat."""
    start, end = summary["window"]["start"], summary["window"]["end"]
    plan = report / "run.json"
    if plan.is_file():
        recorded = json.loads(plan.read_text())
        if recorded.get("window_start") is not None:
            assert recorded["window_start"] == start
    return start, end


# --- the tests -----------------------------------------------------------------------


def test_every_percentile_of_the_summary_is_recomputed_exactly(runs: list[Path]) -> None:
    for report in runs:
        summary = json.loads((report / "summary.json").read_text())
        rows = _records(report)
        start, end = _window(report, summary)
        win = _sent_in(rows, start, end)
        samples = _samples(win)
        assert len(samples["ttft"]) >= 100 and len(samples["ttft"]) < len(samples["e2e"])
        lat = summary["latency"]
        for key, values in samples.items():
            if key.endswith("from_schedule"):
                assert lat[key] is not None, key  # open loop
            _assert_stats(lat[key], values, key)
        lateness = [r["sent_at"] - r["scheduled_at"] for r in win]
        _assert_stats(summary["lateness"], lateness, "lateness")

        # Per replica: successful requests sent in the window, grouped by replica.
        for rep in summary["replicas"]:
            mine = [r for r in win if (r["replica"] or "unknown") == rep["replica"]]
            s = _samples(mine)
            for fig, vals in (("ttft", s["ttft"]), ("e2e", s["e2e"])):
                for p in ("p50", "p99"):
                    assert rep[f"{fig}_{p}"] == _reported(vals, p), (rep["replica"], fig, p)

        # SLO checks: the latency table's P99 (the maximum below 100 samples).
        checks = {c["name"]: c for c in summary["slo_checks"]}
        assert checks["p99_ttft"]["value"] == _p99_or_max(samples["ttft"]) == lat["ttft"]["p99"]
        assert checks["p99_e2e"]["value"] == _p99_or_max(samples["e2e"]) == lat["e2e"]["p99"]

        # Stages: the stage's own span, from the run's start.
        assert len(summary["stages"]) == 2
        for st in summary["stages"]:
            s = _samples(
                _sent_in(
                    rows, summary["run_start"] + st["start_s"], summary["run_start"] + st["end_s"]
                )
            )
            for fig in ("ttft", "e2e"):
                expect = _pct(s[fig], 99.0) if len(s[fig]) >= 100 else None
                assert st[f"{fig}_p99"] == expect, (st["index"], fig)

        # Cross-check: the summary's own figures, nothing else.
        cc = summary["cross_check"]
        assert cc is not None
        compared = [q for q in cc["quantiles"] if q["exact"] is not None]
        assert compared, cc
        for q in compared:
            fig, p = q["name"].split("_")
            assert q["exact"] == lat[fig][p], q["name"]
            # A clean run: histogram resolution alone never makes a quantile disagree.
            assert q["agree"] is True, q["detail"]


def test_every_percentile_of_compare_is_recomputed_exactly(runs: list[Path]) -> None:
    a, b = runs
    proc = _lbtune("compare", str(a), str(b), "--format", "json", "--resamples", "200")
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    figures = {f["key"]: f for f in result["figures"]}
    for side, report in (("a", a), ("b", b)):
        summary = json.loads((report / "summary.json").read_text())
        start, end = _window(report, summary)
        s = _samples(_sent_in(_records(report), start, end))
        expect = {
            "ttft_p50": _reported(s["ttft"], "p50"),
            "ttft_p99": _reported(s["ttft"], "p99"),
            "e2e_p99": _reported(s["e2e"], "p99"),
            "itl_p50": _reported(s["itl"], "p50"),
        }
        for key, value in expect.items():
            assert value is not None, key
            assert figures[key][side] == value, (side, key)
