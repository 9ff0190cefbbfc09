"""The report's frame carries each probe's figures per replica, and picks the probe whose
table the text shows."""

from __future__ import annotations

from dataclasses import replace

from lbtune.capacity.frame import frame, replica_probe
from lbtune.capacity.replicas import ReplicaFigures
from lbtune.capacity.search import ProbeResult, SearchOptions, search
from tests.capacity.curves import CurveProbe, logistic
from tests.capacity.test_plot import cliff_search


class Attributed:
    """:class:`CurveProbe` with every request attributed: ``a`` meets the SLO, ``b`` gets
    the misses."""

    def __init__(self) -> None:
        self.curve = CurveProbe(logistic(10.0, 0.95, width=0.5))

    def __call__(self, rate: float) -> ProbeResult:
        p = self.curve(rate)
        half = p.judged // 2
        a = ReplicaFigures("a", half, half)
        b = ReplicaFigures("b", p.met - half, p.judged - half)
        return replace(p, replicas=(a, b))


def test_the_frame_carries_each_probes_figures_per_replica() -> None:
    result = search(Attributed(), SearchOptions(attainment=0.95, precision=0.2, max_probes=6))
    f = frame(result, "live", 1.0)
    assert len(f.probes) == len(result.probes) > 1
    for row, probe in zip(f.probes, result.probes, strict=True):
        assert row.replicas == probe.replicas and len(row.replicas) == 2
        assert sum(r.judged for r in row.replicas) == row.judged


def test_the_probe_shown_is_the_attributed_one_nearest_the_capacity() -> None:
    s = cliff_search()  # capacity 9.04 req/s; probes at 4, 8, 9, 10 and 12 (behind)
    per = (ReplicaFigures("a", 1, 1),)

    def shown(attributed: set[float]) -> float | None:
        probes = tuple(replace(p, replicas=per if p.rate in attributed else ()) for p in s.probes)
        got = replica_probe(replace(s, probes=probes), 0.95)
        if got is None:
            return None
        assert got[1] == "nearest the capacity"
        return got[0].rate

    assert shown({4.0, 10.0, 12.0}) == 10.0
    assert shown({4.0, 12.0}) == 4.0  # not 12: its generator fell behind
    assert shown(set()) is None  # no attribution anywhere
