"""A capacity-objective trial's attainment: the share of its requests within the SLO,
judged by the rule ``lbtune capacity`` judges a probe by (:mod:`lbtune.capacity.
attainment`), so that a study's figure and a capacity search's are the same figure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from lbtune.capacity.attainment import attainment
from lbtune.objective import Figures, ObjectiveSpec
from lbtune.records.requests import RequestRecord

__all__ = ["with_attainment"]


def with_attainment(
    figures: Figures,
    records: Iterable[RequestRecord],
    window: tuple[float, float],
    spec: ObjectiveSpec | None,
) -> Figures:
    """``figures`` with the attainment of the requests sent in ``window`` under the
    capacity objective's SLO; unchanged under another objective."""
    if spec is None or spec.kind != "capacity" or spec.slo is None:
        return figures
    got = attainment(records, window, spec.slo)
    return replace(figures, attainment=got.met / got.judged if got.judged else None)
