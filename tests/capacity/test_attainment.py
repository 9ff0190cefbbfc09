"""A run's attainment from its records: errors miss, cancelled ones by their lower bound."""

from __future__ import annotations

from lbtune.capacity.attainment import attainment
from lbtune.records.slo import Slo
from tests.metrics.records import rec


def test_attainment_judges_the_window_errors_and_cut_off_requests() -> None:
    slo = Slo(ttft_s=0.5, e2e_s=2.0)
    records = [
        rec(0, sent=10.0, ttft=0.1, e2e=1.0),  # met
        rec(1, sent=11.0, ttft=0.9, e2e=1.0),  # TTFT too slow: a miss
        rec(2, sent=12.0, ttft=0.1, e2e=3.0),  # E2E too slow: a miss
        rec(3, sent=13.0, outcome="http_error", ttft=None, e2e=0.1),  # an error: a miss
        rec(4, sent=14.0, outcome="cancelled", ttft=0.1, e2e=2.5),  # cut off past E2E: a miss
        rec(5, sent=15.0, outcome="cancelled", ttft=None, e2e=0.7),  # no token by 0.7 s: a miss
        rec(6, sent=16.0, outcome="cancelled", ttft=0.1, e2e=0.3),  # might have met it
        rec(7, sent=5.0, ttft=0.1, e2e=1.0),  # before the window
        rec(8, sent=20.0, ttft=0.1, e2e=1.0),  # after it
    ]
    got = attainment(records, (10.0, 20.0), slo)
    assert (got.met, got.judged, got.unjudged) == (1, 6, 1)
    assert got.share == 1 / 6
    # five 2-s blocks of the window; blocks without a judged request are left out
    assert got.blocks == ((1, 2), (0, 2), (0, 2))
