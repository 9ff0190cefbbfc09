"""``study.json`` (the CI contract, docs/optimize.md) and ``lbtune optimize --json``: the text
written, checked against golden files first written by the code before pydantic.

Quirks the JSON form keeps: ``schema_version`` first and the keys in the order of the
golden files (not the dataclasses' field order); ``spec`` written as ``objective``,
``baseline``/``best`` as ``baseline_trial``/``best_trial``, a comparison's ``ci_low``/
``ci_high`` as ``ci95``, a rollout's ``verify_ci`` as ``verify_ci95``; the computed
``counts``, ``best_params``, ``best_objective``, ``improvement_vs_baseline``; the
confirmation's baseline samples left out; NaN and infinities as ``null``; tuples as lists;
trial numbers of ``intermediate`` as strings.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lbtune.objective import Figures, ObjectiveSpec
from lbtune.report.study import study_json, write_study_report
from lbtune.search.result import (
    Comparison,
    Confirmation,
    Pooled,
    Rollout,
    RoundRun,
    StudyResult,
    TrialResult,
)
from lbtune.search.trial import Samples
from tests import golden
from tests.report import test_browser_layout, test_junit

FIG = Figures(
    p99_e2e_s=1.2,
    p99_ttft_s=0.3,
    decay=0.05,
    error_rate=0.002,
    requests_per_s=5.0,
    goodput_per_s=4.5,
    output_tokens_per_s=512.25,
    p50_ttft_s=0.1,
    balance=0.11,
    completed=50,
    p99_e2e_ci=(1.1, 1.35),
    p99_ttft_ci=(0.28, math.nan),
    samples=120,
    censored=2,
)


def full() -> StudyResult:
    """Every part of a study: failed and pruned trials, a Pareto front, a confirmation with
    rounds and pooled arms, a verified rollout, non-finite figures and non-ASCII notes."""
    trials = (
        TrialResult(
            0, "COMPLETE", "live", {"w": 1, "algo": "leastconn", "on": True, "f": 0.5}, 1.0,
            (1.0,), FIG, True, duration_s=9.5, intermediate={0: 1.1, 1: 1.0},
        ),
        TrialResult(1, "PRUNED", "round-robin", {"w": 2}, duration_s=4.0, intermediate={0: 3.0}),
        TrialResult(2, "FAIL", "sampled", {"w": 3}, fail_reason="apply failed: <boom> — ✗"),
        TrialResult(
            3, "COMPLETE", "sampled", {"w": 4}, 0.8, (0.8, 0.3, -4.5),
            Figures(p99_e2e_s=math.inf, p99_ttft_s=0.2), False, duration_s=9.0,
        ),
        TrialResult(4, "RUNNING", "retry", {"w": 5}),
    )  # fmt: skip
    pooled_a = Pooled((1, 3), 600, 590, 1.3, 0.31, 0.1, 5.0, 0.001, 1.0)
    pooled_b = Pooled((1, 3), 600, 600, 1.0, None, 0.09, 5.1, 0.0, math.nan)
    comp = Comparison(
        3, {"w": 4}, (0.8, 0.79), (1.0, 1.01), -0.2, -0.3, -0.1, -0.2, True, True, FIG,
        arm="B1", rounds=(1, 3), candidate=pooled_b, baseline=pooled_a, baseline_figures=FIG,
        level=0.9,
    )  # fmt: skip
    rounds = (
        RoundRun(1, "A", 0, "confirm-1-A", True, requests=300, sent=301, errors=1,
                 tail_e2e_s=1.3, tail_ttft_s=0.3, requests_per_s=5.0, score=1.0,
                 window=(1_700_000_000.0, 1_700_000_030.5)),
        RoundRun(2, "B1", 3, "confirm-2-B1", False, reason="balancer down"),
    )  # fmt: skip
    samples = Samples.of([0.1, 0.2], [1.0, 1.1], sent=2)
    conf = Confirmation(
        "improved", 0, FIG, (comp,), winner=3, runs_per_arm=3, order=("A", "B1", "A", "B1"),
        baseline_samples=(samples,), rounds=rounds, quantile=95.0, note="P95: too few for P99",
    )  # fmt: skip
    rollout = Rollout(
        True, "ansible", True, False, "verified", FIG, verify_diff=-0.1, verify_ci=(-0.2, -0.01)
    )
    return StudyResult(
        study="nightly-ü",
        storage="sqlite:///reports/studies.db",
        target="haproxy",
        scenario="scenarios/chat.yaml",
        sampler="nsga2",
        spec=ObjectiveSpec(kind="pareto", max_error_rate=0.02),
        budget=5,
        trials=trials,
        best=3,
        baseline=0,
        pareto_front=(0, 3),
        importances={"w": 0.75, "algo": 0.25},
        confirmation=conf,
        rollout=rollout,
        interrupted=True,
        elapsed_s=123.456,
        report_dir="reports/x",
        notes=("budget reached", "naïve"),
        started_at="2024-01-01T00:00:00",
    )


def studies() -> dict[str, StudyResult]:
    return {
        "layout": test_browser_layout.study(),
        "junit": test_junit.study(Rollout(False, "direct", None, True, "rolled back")),
        "bare": test_junit.study(confirmation=None, best=None, baseline=None),
        "full": full(),
    }


@pytest.mark.parametrize("name", ["layout", "junit", "bare", "full"])
def test_study_json_is_the_golden_text(name: str) -> None:
    text = study_json(studies()[name])
    assert text == golden.expected(f"study-{name}.json", text)


def test_the_report_writes_it(tmp_path: Path) -> None:
    paths = write_study_report(tmp_path, full())
    assert paths.study_json.read_text() == golden.read("study-full.json")


def test_the_baseline_samples_stay_out() -> None:
    assert "baseline_samples" not in study_json(full())
    assert np.isfinite(full().confirmation.baseline_samples[0].e2e).all()  # type: ignore[union-attr]
