"""A probe's figures per replica, from hand-made records: the same window, judging rule and
percentiles as the probe's overall figures, split by the replica that served each request."""

from __future__ import annotations

import pytest

from lbtune.capacity.attainment import attainment
from lbtune.capacity.probes import latency
from lbtune.capacity.replicas import ReplicaFigures, replica_figures
from lbtune.metrics.stats import latencies
from lbtune.records.quantiles import percentile
from lbtune.records.requests import RequestRecord
from lbtune.records.slo import Slo
from tests.metrics.records import rec

SLO = Slo(ttft_s=0.5, tpot_s=0.1, e2e_s=2.0)
WINDOW = (10.0, 20.0)


def split_records() -> list[RequestRecord]:
    """Replica ``fast`` meets the SLO but for one error; ``slow`` misses its TTFT on three
    of seven; two requests have no replica; one of ``late`` was sent before the window."""
    return [
        *(rec(i, sent=10.0 + i, ttft=0.1, e2e=0.9, replica="fast") for i in range(4)),
        rec(4, sent=14.5, outcome="http_error", ttft=None, e2e=0.1, replica="fast"),
        rec(5, sent=11.5, ttft=0.1, e2e=0.9, replica="slow"),
        rec(6, sent=12.5, ttft=0.2, e2e=1.0, replica="slow"),
        *(rec(7 + i, sent=13.0 + i, ttft=0.9, e2e=1.5, replica="slow") for i in range(3)),
        rec(10, sent=16.0, outcome="cancelled", ttft=0.1, e2e=2.5, replica="slow"),  # a miss
        rec(11, sent=17.0, outcome="cancelled", ttft=0.1, e2e=0.3, replica="slow"),  # unjudged
        rec(12, sent=18.0, ttft=0.1, e2e=0.9, replica=None),
        rec(13, sent=18.5, outcome="http_error", ttft=None, e2e=0.01, replica=None),
        rec(14, sent=5.0, ttft=0.1, e2e=0.9, replica="late"),  # before the window
    ]


def test_two_replicas_one_slow_are_told_apart() -> None:
    fast, slow = replica_figures(split_records(), WINDOW, SLO)
    assert (fast.replica, fast.met, fast.judged, fast.unjudged) == ("fast", 4, 5, 0)
    # the cancelled request past its E2E bound is a miss, the one within it left out
    assert (slow.replica, slow.met, slow.judged, slow.unjudged) == ("slow", 2, 6, 1)
    assert fast.attainment == 0.8 and slow.attainment == pytest.approx(2 / 6)


def test_the_split_adds_up_to_the_attainment_of_the_attributed_requests() -> None:
    records = split_records()
    rows = replica_figures(records, WINDOW, SLO)
    attributed = attainment([r for r in records if r.replica is not None], WINDOW, SLO)
    overall = attainment(records, WINDOW, SLO)
    assert sum(r.judged for r in rows) == attributed.judged == overall.judged - 2
    assert sum(r.met for r in rows) == attributed.met == overall.met - 1
    assert sum(r.unjudged for r in rows) == overall.unjudged == 1
    assert "late" not in {r.replica for r in rows}  # served nothing in the window


def test_without_attribution_there_are_no_rows() -> None:
    records = [rec(i, sent=10.0 + i, replica=None) for i in range(5)]
    assert attainment(records, WINDOW, SLO).judged == 5
    assert replica_figures(records, WINDOW, SLO) == ()


def test_percentiles_are_the_summarys_and_withheld_below_their_samples() -> None:
    ttfts = [0.001 * (i + 1) for i in range(120)]
    many = [
        rec(i, sent=10.0 + i / 20, ttft=t, e2e=t + 0.09 * (1 + i % 7), replica="many")
        for i, t in enumerate(ttfts)
    ]
    few = [rec(200 + i, sent=12.0 + i / 10, ttft=0.2, e2e=0.5, replica="few") for i in range(50)]
    got = {r.replica: r for r in replica_figures(many + few, WINDOW, SLO)}
    tpots = [r.tpot for r in many if r.tpot is not None]
    assert got["many"].ttft_p99 == pytest.approx(percentile(ttfts, 99))
    assert got["many"].ttft_p50 == pytest.approx(percentile(ttfts, 50))
    assert got["many"].tpot_p99 == pytest.approx(percentile(tpots, 99))
    # 50 samples: a P50, no P99 (it needs 100)
    assert got["few"].ttft_p50 == pytest.approx(0.2) and got["few"].ttft_p99 is None
    assert got["few"].tpot_p99 is None
    # one replica alone: its figures are the probe's own (the summary's percentiles)
    lat = latency(latencies(many))
    (alone,) = replica_figures(many, WINDOW, SLO)
    assert (alone.ttft_p50, alone.ttft_p99, alone.tpot_p50, alone.tpot_p99) == (
        lat.ttft_p50,
        lat.ttft_p99,
        lat.tpot_p50,
        lat.tpot_p99,
    )


def test_a_replica_with_only_unjudged_requests_has_no_attainment() -> None:
    cut = rec(0, sent=11.0, outcome="cancelled", ttft=0.1, e2e=0.2, replica="r0")
    assert replica_figures([cut], WINDOW, SLO) == (ReplicaFigures("r0", 0, 0, 1),)
    assert ReplicaFigures("r0", 0, 0, 1).attainment is None
