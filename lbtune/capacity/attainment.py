"""Attainment of one run: how many of its requests met the SLO (from its records).

Over the requests **sent** in the run's measurement window (as every figure of a run):

* ``ok`` — judged; it meets the SLO when within every bound
  (:func:`lbtune.metrics.stats.meets_slo`: TTFT, TPOT where bounded and measurable, E2E);
* an error (``http_error``, ``broken_stream``, ``timeout``, ``connect_error``) — judged, a
  miss: a request the cluster failed was not served within any SLO;
* ``cancelled`` (still running when the run ended) — what had elapsed is a lower bound
  of its latencies (:mod:`lbtune.metrics.censor`): a miss when that already breaks the
  TTFT or the E2E bound, otherwise **unjudged** (left out, and counted), since it might
  still have met it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lbtune.metrics.stats import meets_slo
from lbtune.records.requests import ERROR_OUTCOMES, RequestRecord
from lbtune.records.slo import Slo

__all__ = ["Attainment", "attainment"]


@dataclass(frozen=True)
class Attainment:
    met: int
    judged: int
    unjudged: int
    """Cancelled requests whose bounds were not yet broken (left out of ``judged``)."""

    @property
    def share(self) -> float | None:
        return self.met / self.judged if self.judged else None


def attainment(
    records: Iterable[RequestRecord], window: tuple[float, float], slo: Slo
) -> Attainment:
    """The attainment of the requests sent in ``window`` (``[start, end)``) under ``slo``."""
    start, end = window
    met = judged = unjudged = 0
    for r in records:
        if not start <= r.sent_at < end:
            continue
        if r.outcome == "ok":
            judged += 1
            met += meets_slo(r, slo)
        elif r.outcome in ERROR_OUTCOMES:
            judged += 1
        elif r.outcome == "cancelled":
            if _broken(r, slo):
                judged += 1
            else:
                unjudged += 1
    return Attainment(met, judged, unjudged)


def _broken(r: RequestRecord, slo: Slo) -> bool:
    """Whether a cancelled request had already broken a bound when it was cut off."""
    elapsed = r.e2e
    if slo.e2e_s is not None and elapsed > slo.e2e_s:
        return True
    if slo.ttft_s is None:
        return False
    ttft = r.ttft if r.ttft is not None else elapsed
    return ttft > slo.ttft_s
