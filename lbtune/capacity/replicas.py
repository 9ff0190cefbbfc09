"""A probe's figures per replica: which replica served the requests that missed the SLO.

The overall attainment of a probe says whether the cluster holds the SLO; split by the
replica that served each request (:attr:`~lbtune.records.requests.RequestRecord.replica`,
where the balancer lets lbtune attribute it: a response header), it says whether one
slow or overloaded replica is what breaks it. The figures are the probe's own, computed
the same way: the requests sent in the probe's window, judged by
:func:`lbtune.capacity.attainment.attainment` (group by group, so a replica's judged
counts sum with the others' to the attainment of the attributed requests), and TTFT and
TPOT percentiles from :func:`lbtune.metrics.stats.latencies`, the run summary's owner (a
percentile withheld when a replica has too few samples for it, as in every summary).

A request without a replica (the balancer answered it itself, or does not say which
replica served it) is left out; a probe with no attributed request has no rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lbtune.capacity.attainment import attainment
from lbtune.metrics.stats import latencies, sent_in
from lbtune.metrics.summary import Window
from lbtune.records.requests import RequestRecord
from lbtune.records.slo import Slo

__all__ = ["ReplicaFigures", "replica_figures"]


@dataclass(frozen=True)
class ReplicaFigures:
    """One replica's share of a probe: its attainment and latency percentiles (seconds;
    None where the replica had too few samples for the percentile)."""

    replica: str
    met: int
    judged: int
    unjudged: int = 0
    """Cancelled requests left out of ``judged`` (:mod:`lbtune.capacity.attainment`)."""
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    tpot_p50: float | None = None
    tpot_p99: float | None = None

    @property
    def attainment(self) -> float | None:
        return self.met / self.judged if self.judged else None


def replica_figures(
    records: Iterable[RequestRecord], window: tuple[float, float], slo: Slo
) -> tuple[ReplicaFigures, ...]:
    """Per replica (by name) that served requests sent in ``window`` (``[start, end)``):
    attainment under ``slo`` and TTFT/TPOT P50/P99; empty when none was attributed."""
    groups: dict[str, list[RequestRecord]] = {}
    for r in sent_in(records, Window(*window)):
        if r.replica is not None:
            groups.setdefault(r.replica, []).append(r)
    return tuple(_figures(name, groups[name], window, slo) for name in sorted(groups))


def _figures(
    name: str, group: list[RequestRecord], window: tuple[float, float], slo: Slo
) -> ReplicaFigures:
    got = attainment(group, window, slo)
    lat = latencies(group)
    return ReplicaFigures(
        name,
        got.met,
        got.judged,
        got.unjudged,
        lat.ttft.p50,
        lat.ttft.p99,
        lat.tpot.p50,
        lat.tpot.p99,
    )
