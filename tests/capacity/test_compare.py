"""Two searches probed in turn, the ratio of their capacities with a CI, and the gate."""

from __future__ import annotations

import pytest

from lbtune.capacity.compare import (
    Ratio,
    Side,
    compare_searches,
    gate,
    parse_gate,
    ratio,
)
from lbtune.capacity.fit import CiOptions
from lbtune.capacity.search import ProbeResult, SearchOptions
from lbtune.errors import ConfigError
from tests.capacity.curves import CurveProbe, logistic


class Logged:
    def __init__(self, name: str, inner: CurveProbe, log: list[str]) -> None:
        self.name, self.inner, self.log = name, inner, log

    def __call__(self, rate: float) -> ProbeResult:
        self.log.append(self.name)
        return self.inner(rate)


def test_searches_run_in_turn_and_their_ratio_has_a_ci() -> None:
    log: list[str] = []
    a = Logged("A", CurveProbe(logistic(10.0, 0.99, width=0.6), n=5000), log)
    b = Logged("B", CurveProbe(logistic(13.0, 0.99, width=0.6), n=5000), log)
    opts = SearchOptions(attainment=0.99, precision=0.1)
    (ta, fa), (tb, fb) = compare_searches([Side("A", a), Side("B", b)], opts)
    assert ta is None and tb is None
    n = min(log.count("A"), log.count("B"))
    assert log[: 2 * n] == ["A", "B"] * n  # interleaved while both run
    assert fa.converged and fb.converged
    r = ratio(fa, fb, 0.99, CiOptions())
    assert r.value is not None and r.ci is not None and r.ci[1] is not None
    assert r.ci[0] <= 1.3 <= r.ci[1] and r.ci[0] > 1.0  # B serves more, significantly
    assert abs(r.value - 1.3) < 0.1


def test_each_side_gets_its_own_twin_bracket() -> None:
    a = CurveProbe(logistic(10.0, 0.99, width=0.6), n=5000)
    b = CurveProbe(logistic(20.0, 0.99, width=0.6), n=5000)
    ta = CurveProbe(logistic(11.0, 0.99, width=0.6), n=5000, source="twin")
    tb = CurveProbe(logistic(21.0, 0.99, width=0.6), n=5000, source="twin")
    opts = SearchOptions(attainment=0.99, precision=0.1)
    frames = compare_searches([Side("A", a, ta), Side("B", b, tb)], opts, twin_margin=0.2)
    assert frames[0][0] is not None and frames[1][0] is not None
    ca, cb = frames[0][0].capacity, frames[1][0].capacity
    assert ca is not None and cb is not None
    assert a.rates[0] == pytest.approx(ca * 0.8) and b.rates[0] == pytest.approx(cb * 0.8)


def test_gate_fails_only_when_the_whole_ci_is_beyond_the_limit() -> None:
    assert gate(Ratio(0.8, (0.75, 0.85), 0.9), -0.05) is not None
    assert gate(Ratio(0.9, (0.8, 0.96), 0.9), -0.05) is None  # may be within 5 %
    assert gate(Ratio(1.1, (1.0, 1.2), 0.9), -0.05) is None
    assert gate(Ratio(None, None, 0.9), -0.05) is None
    why = gate(Ratio(0.8, (0.75, 0.85), 0.9), -0.05)
    assert why is not None and "80.0% of the reference" in why


def test_parse_gate() -> None:
    assert parse_gate("capacity=-5%") == -0.05
    for bad in ("capacity=5%", "p99=+10%", "capacity=-5"):
        with pytest.raises(ConfigError, match="expected capacity=-N%"):
            parse_gate(bad)
