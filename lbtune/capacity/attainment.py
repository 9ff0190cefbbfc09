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

The window is also cut into :data:`BLOCKS` consecutive blocks of equal length, each with
its own (met, judged), for the block bootstrap of the capacity's CI
(:mod:`lbtune.capacity.fit`). A probe's figures per replica
(:mod:`lbtune.capacity.replicas`) are this function over each replica's requests.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lbtune.metrics.stats import meets_slo
from lbtune.metrics.summary import Window
from lbtune.records.requests import ERROR_OUTCOMES, RequestRecord
from lbtune.records.slo import Slo

__all__ = ["BLOCKS", "Attainment", "attainment"]

BLOCKS = 5
"""Time blocks per probe window."""


@dataclass(frozen=True)
class Attainment:
    met: int
    judged: int
    unjudged: int
    """Cancelled requests whose bounds were not yet broken (left out of ``judged``)."""
    blocks: tuple[tuple[int, int], ...] = ()
    """(met, judged) per time block of the window, in order."""

    @property
    def share(self) -> float | None:
        return self.met / self.judged if self.judged else None


def attainment(
    records: Iterable[RequestRecord], window: tuple[float, float], slo: Slo
) -> Attainment:
    """The attainment of the requests sent in ``window`` (``[start, end)``) under ``slo``."""
    start, end = window
    span = max(end - start, 1e-9)
    met = [0] * BLOCKS
    judged = [0] * BLOCKS
    unjudged = 0
    inside = Window(start, end).contains
    for r in records:
        if not inside(r.sent_at):
            continue
        b = min(BLOCKS - 1, int((r.sent_at - start) / span * BLOCKS))
        if r.outcome == "ok":
            judged[b] += 1
            met[b] += meets_slo(r, slo)
        elif r.outcome in ERROR_OUTCOMES or (r.outcome == "cancelled" and _broken(r, slo)):
            judged[b] += 1
        elif r.outcome == "cancelled":
            unjudged += 1
    blocks = tuple((m, n) for m, n in zip(met, judged, strict=True) if n > 0)
    return Attainment(sum(met), sum(judged), unjudged, blocks)


def _broken(r: RequestRecord, slo: Slo) -> bool:
    """Whether a cancelled request had already broken a bound when it was cut off."""
    elapsed = r.e2e
    if slo.e2e_s is not None and elapsed > slo.e2e_s:
        return True
    if slo.ttft_s is None:
        return False
    ttft = r.ttft if r.ttft is not None else elapsed
    return ttft > slo.ttft_s
