"""The exporter's text format parses and its counters match the records."""

from __future__ import annotations

import dataclasses
import itertools
import random
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from lbtune.loadgen.exporter import ITL_BUCKETS, ExporterServer, MetricsRegistry
from lbtune.sim.metrics import Histogram
from tests.records.test_requests import rec

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of the exposition, by name and label set (the library's parser)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def at(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_counters_and_histograms_match_records() -> None:
    reg = MetricsRegistry()
    rs = [
        rec(0),
        rec(1),
        rec(2, outcome="broken_stream", replica="a100-1"),
        rec(3, outcome="http_error", replica=None, output_tokens=None),
    ]
    for r in rs:
        reg.observe(r)
    reg.set_in_flight(4)
    reg.set_generator("w0", 0.002, 37.5)
    m = parse(reg.render())
    assert at(m, "lbtune_requests_total", outcome="ok", replica="h100-0") == 2
    assert at(m, "lbtune_requests_total", outcome="broken_stream", replica="a100-1") == 1
    assert at(m, "lbtune_requests_total", outcome="http_error", replica="unknown") == 1
    assert at(m, "lbtune_output_tokens_total", replica="h100-0") == 6
    assert at(m, "lbtune_ttft_seconds_count", replica="h100-0", model="m") == 2
    assert at(m, "lbtune_ttft_seconds_bucket", replica="h100-0", model="m", le="0.04") == 0
    assert at(m, "lbtune_ttft_seconds_bucket", replica="h100-0", model="m", le="0.05") == 2
    assert at(m, "lbtune_itl_seconds_count", replica="h100-0", model="m") == 4
    assert at(m, "lbtune_in_flight") == 4
    assert at(m, "lbtune_generator_cpu_percent", worker="w0") == 37.5
    assert abs(at(m, "lbtune_e2e_seconds_sum", replica="h100-0", model="m") - 3.0) < 1e-9


def test_served_over_http() -> None:
    reg = MetricsRegistry()
    reg.observe(rec(0))
    srv = ExporterServer(reg, 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=5) as resp:
            assert resp.status == 200
            assert "lbtune_requests_total" in resp.read().decode()
    finally:
        srv.close()


def test_itl_histogram_is_each_gap_observed() -> None:
    """The registry buckets a record's gaps in one go; each bucket must hold what observing
    every gap on its own gives (a gap right on a bound belongs to that bound: ``le``)."""
    rnd = random.Random(3)
    gaps = [0.5, 0.75, 1.0, 0.0, *ITL_BUCKETS, 5.0, *(rnd.expovariate(80.0) for _ in range(300))]
    times = [100.0]
    for g in gaps:
        times.append(times[-1] + g)
    r = dataclasses.replace(rec(0), chunk_times=tuple(times), first_token_at=times[0])
    reg = MetricsRegistry()
    reg.observe(r)
    ref = Histogram(ITL_BUCKETS)
    for a, b in itertools.pairwise(times):
        ref.observe(b - a)
    m = parse(reg.render())
    for le, want in ref.buckets():
        got = at(m, "lbtune_itl_seconds_bucket", replica="h100-0", model="m", le=le)
        assert got == want, le
    assert at(m, "lbtune_itl_seconds_count", replica="h100-0", model="m") == len(gaps)
    assert abs(at(m, "lbtune_itl_seconds_sum", replica="h100-0", model="m") - ref.sum) < 1e-6
