"""The objective, its constraints and the Pareto pick rule, with hand-computed cases."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from lbtune.errors import ConfigError
from lbtune.objective import (
    FIGURES,
    Figures,
    ObjectiveSpec,
    composite,
    constraints,
    dominates,
    feasible,
    make_spec,
    pareto_front,
    pareto_values,
    parse_weights,
    pick,
    values,
)
from lbtune.records.jsonform import json_data
from lbtune.records.slo import Slo


def test_composite_default_weights_and_refs() -> None:
    # 0.45 * 0.96/0.8 + 0.35 * 0.058/0.35 + 0.20 * 0.06/0.12 = 0.54 + 0.058 + 0.1 = 0.698
    f = Figures(p99_e2e_s=0.96, p99_ttft_s=0.058, decay=0.06)
    assert composite(f, ObjectiveSpec()) == pytest.approx(0.698)


def test_composite_at_thresholds_is_one() -> None:
    assert composite(Figures(0.8, 0.35, 0.12), ObjectiveSpec()) == pytest.approx(1.0)


def test_source_material_round_robin_scores_worse_than_tuned() -> None:
    rr = Figures(p99_e2e_s=2.14, p99_ttft_s=0.120)  # 0.45*2.675 + 0.35*0.342857 = 1.32375
    tuned = Figures(p99_e2e_s=0.96, p99_ttft_s=0.058)  # 0.54 + 0.058 = 0.598
    spec = ObjectiveSpec()
    assert composite(rr, spec) == pytest.approx(1.32375)
    assert composite(tuned, spec) == pytest.approx(0.598)


def test_weights_and_slo_overrides() -> None:
    spec = make_spec(weights="e2e=1,ttft=0,decay=0", e2e_ref_s=2.0)
    assert composite(Figures(1.0, 5.0, 1.0), spec) == pytest.approx(0.5)
    assert parse_weights("ttft=0.5") == {"e2e": 0.45, "ttft": 0.5, "decay": 0.2}
    with pytest.raises(
        ConfigError, match="--weights: unknown key 'latency'; expected one of e2e, ttft, decay"
    ):
        parse_weights("latency=1")
    with pytest.raises(ConfigError, match="at least one weight"):
        parse_weights("e2e=0,ttft=0,decay=0")
    with pytest.raises(ConfigError, match=r"objective 'best'\. Available: composite, pareto"):
        make_spec("best")


def test_a_spec_says_whether_its_score_reads_ttfts() -> None:
    """What decides whether a trial whose TTFT timing bound is too wide is trusted."""
    assert make_spec().reads_ttft and make_spec("pareto").reads_ttft
    assert not make_spec(weights="e2e=1,ttft=0,decay=0").reads_ttft
    assert ObjectiveSpec(kind="capacity", slo=Slo(ttft_s=1.0)).reads_ttft
    assert not ObjectiveSpec(kind="capacity", slo=Slo(e2e_s=60.0)).reads_ttft


def test_error_rate_constraint() -> None:
    spec = ObjectiveSpec(max_error_rate=0.01)
    assert constraints(Figures(1, 1, error_rate=0.003), spec) == [pytest.approx(-0.007)]
    assert feasible(Figures(1, 1, error_rate=0.01), spec)  # exactly at the limit is feasible
    assert not feasible(Figures(1, 1, error_rate=0.037), spec)


def test_pareto_values_and_front() -> None:
    assert pareto_values(Figures(1.0, 0.1, goodput_per_s=9.0)) == (1.0, 0.1, -9.0)
    assert pareto_values(Figures(1.0, 0.1, requests_per_s=7.0)) == (1.0, 0.1, -7.0)
    pts = [(1, 1, -5), (2, 0.5, -5), (2, 2, -4), (1, 1, -5)]
    assert dominates(pts[0], pts[2]) and not dominates(pts[0], pts[1])
    assert pareto_front(pts) == [0, 1, 3]
    assert values(Figures(1.0, 0.1, goodput_per_s=9.0), ObjectiveSpec(kind="pareto")) == [
        1.0,
        0.1,
        -9.0,
    ]


def test_pick_rule_feasible_front_point_with_lowest_composite() -> None:
    spec = ObjectiveSpec(kind="pareto")
    cands = [
        Figures(0.5, 0.05, goodput_per_s=9, error_rate=0.2),  # best but infeasible
        Figures(0.9, 0.10, goodput_per_s=9),  # front, composite 0.50625 + 0.1 = 0.60625
        Figures(0.7, 0.30, goodput_per_s=8),  # front, composite 0.39375 + 0.3 = 0.69375
        Figures(1.0, 0.30, goodput_per_s=7),  # dominated
    ]
    assert pick(cands, spec) == 1
    assert pick([cands[0]], spec) is None


def test_importing_the_cli_stays_light() -> None:
    code = (
        "import sys, lbtune.cli.optimize, lbtune.objective, lbtune.search.result; "
        "print(sorted(m for m in ('optuna', 'pandas', 'matplotlib', 'locust') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_figures_json_form_and_what_reads_back() -> None:
    """Every field in field order (the capacity objective's two only where set), a
    non-finite figure ``null``; a trial's Optuna attribute (or an old ``study.json``) reads
    back: unknown keys ignored, an interval with a ``null`` bound as none, a ``null``
    figure as NaN."""
    fig = Figures(math.inf, 0.3, goodput_per_s=7.0, p99_e2e_ci=(0.8, math.nan), completed=3)
    data = json_data(FIGURES, fig)
    capacity_only = ("slo_stretch", "attainment")
    assert list(data) == [k for k in Figures.__dataclass_fields__ if k not in capacity_only]
    both = json_data(FIGURES, Figures(1.0, 0.3, slo_stretch=0.8, attainment=0.97))
    assert list(both)[-2:] == list(capacity_only) and both["slo_stretch"] == 0.8
    assert data["p99_e2e_s"] is None and data["p99_e2e_ci"] == [0.8, None]
    back = FIGURES.validate_python(json.loads(json.dumps(data)) | {"added_later": 1})
    assert math.isnan(back.p99_e2e_s) and back.p99_e2e_ci is None
    assert back == Figures(back.p99_e2e_s, 0.3, goodput_per_s=7.0, completed=3)
    old = {"p99_e2e_s": 1, "p99_ttft_s": 0.3, "p99_ttft_ci": [0.2, 0.4]}  # before `samples`
    assert FIGURES.validate_python(old) == Figures(1.0, 0.3, p99_ttft_ci=(0.2, 0.4))
