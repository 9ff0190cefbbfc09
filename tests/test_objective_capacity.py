"""The capacity objective: each request's SLO stretch, the stretch at the share asked, its
agreement with the per-request SLO rule, and the spec's one-line errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lbtune.errors import ConfigError
from lbtune.metrics.stats import meets_slo
from lbtune.objective import (
    FAILED_STRETCH,
    Figures,
    ObjectiveSpec,
    make_spec,
    pick,
    score,
    stretch_at,
    stretches,
    values,
)
from lbtune.records.slo import Slo
from tests.metrics.records import rec

SLO = Slo(ttft_s=1.0, e2e_s=10.0, tpot_s=0.1)


def test_a_requests_stretch_is_its_worst_figure_against_its_bound() -> None:
    got = stretches([0.5, 2.0, math.nan], [0.05, 0.05, 0.3], [4.0, 5.0, 20.0], 0, SLO)
    # 0.5 s of 1 s, 0.05 of 0.1, 4 of 10 -> 0.5; TTFT 2 s -> 2; E2E 20 s (TTFT unknown:
    # the response's end is its first token) -> max(20, 3, 2) = 20
    assert got.tolist() == pytest.approx([0.5, 2.0, 20.0])


def test_no_tpot_is_not_judged_on_tpot_and_errors_never_meet() -> None:
    got = stretches([0.2], [math.nan], [1.0], 2, SLO)
    assert got.tolist() == pytest.approx([0.2, FAILED_STRETCH, FAILED_STRETCH])
    assert stretches([0.2], [], [1.0], 0, SLO).tolist() == pytest.approx([0.2])


def test_the_stretch_at_the_share_is_its_percentile() -> None:
    each = np.asarray([0.1 * i for i in range(1, 101)])
    assert stretch_at(each, 0.9) == pytest.approx(np.percentile(each, 90))
    assert math.isnan(stretch_at(np.empty(0), 0.9))


def test_a_stretch_of_at_most_one_is_meeting_the_slo() -> None:
    """Against the per-request rule a capacity search judges by (``meets_slo``), over
    records with every figure either side of its bound."""
    rng = np.random.default_rng(5)
    for i in range(300):
        ttft = float(rng.uniform(0.1, 1.6))
        e2e = ttft + float(rng.uniform(0.5, 14.0))
        tokens = int(rng.integers(1, 120))
        r = rec(i, sent=0.0, ttft=ttft, e2e=e2e, output_tokens=tokens)
        tpot = math.nan if r.tpot is None else r.tpot
        s = float(stretches([r.ttft or math.nan], [tpot], [r.e2e], 0, SLO)[0])
        assert (s <= 1.0) == meets_slo(r, SLO), (ttft, e2e, tokens, s)


def _capacity(**kw: object) -> ObjectiveSpec:
    base: dict[str, object] = {"slo": SLO, "attainment": 0.95, "rate": 5.0}
    base.update(kw)
    return make_spec("capacity", **base)  # type: ignore[arg-type]


def test_the_capacity_score_is_the_stretch_and_the_lowest_is_picked() -> None:
    spec = _capacity()
    figs = [
        Figures(1.0, 0.1, slo_stretch=1.4),
        Figures(9.0, 0.9, slo_stretch=0.8),  # worse P99s, better stretch
        Figures(1.0, 0.1, slo_stretch=0.7, error_rate=0.5),  # infeasible
    ]
    assert [score(f, spec) for f in figs] == [1.4, 0.8, 0.7]
    assert values(figs[0], spec) == [1.4]
    assert pick(figs, spec) == 1
    assert math.isnan(score(Figures(1.0, 0.1), spec))
    assert spec.single and spec.directions == ["minimize"]


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"slo": Slo(ttft_s=None, e2e_s=None)}, "no latency bound"),
        ({"slo": None}, "no latency bound"),
        ({"attainment": 1.5}, "--attainment"),
        ({"rate": None}, "--rate"),
        ({"rate": 0.0}, "--rate"),
    ],
)
def test_a_capacity_spec_without_what_it_needs_is_one_line(
    kw: dict[str, object], says: str
) -> None:
    with pytest.raises(ConfigError, match=says) as err:
        _capacity(**kw)
    assert "\n" not in str(err.value)
