"""What a replica kept busy puts into its fit (lbtune/tune/twinbusy.py); the probe itself
runs against real servers in tests/tune/test_twinfit.py and tests/cluster/test_steady.py."""

from __future__ import annotations

import math

import pytest

from lbtune.cluster.steady import Steady
from lbtune.tune.twinbusy import with_busy
from lbtune.twin.fitted import Measured, ReplicaFit


def _m(value: float, rel: float = 0.1) -> Measured:
    return Measured(value=value, rel_uncertainty=rel)


FIT = ReplicaFit(
    name="r0",
    model="m",
    url="http://127.0.0.1:1",
    prefill_tokens_per_s=_m(10_000.0),
    step_s=_m(0.004),
    step_per_seq_s=_m(0.0001),
    overhead_s=_m(0.002, 0.2),
    kv_s_per_token=_m(1e-7),
    probes=10,
)


def _steady(step_s: float, ttft_s: float, scrape_s: float | None = 0.03) -> Steady:
    return Steady(
        streams=8,
        step_s=step_s,
        ttft_s=ttft_s,
        prompt_tokens=256,
        output_tokens=64,
        scrape_s=scrape_s,
        requests=40,
        sent=50,
    )


def test_the_slope_puts_the_step_of_the_streams_at_the_measured_one() -> None:
    """The time a token at 8 streams, less the lone step, the KV reads the twin adds itself
    (8 x (256 + 32) tokens of context) and the 7 other streams' prefills during a request's
    64 tokens (256 tokens at 10 000 a second each: the twin runs them in steps of their
    own), spread over the 7 other streams."""
    s = _steady(step_s=0.011, ttft_s=0.05)
    got = with_busy(FIT, s)
    kv = 1e-7 * 8 * (256 + 64 / 2)
    others = 7 * (256 / 10_000.0) / 63
    assert got.step_per_seq_s.value == pytest.approx((0.011 - 0.004 - kv - others) / 7)
    assert got.step_per_seq_s.rel_uncertainty == FIT.step_s.rel_uncertainty
    # the twin's own time a token at 8 streams is then the one measured
    twin_step = FIT.step_s.value + 7 * got.step_per_seq_s.value + kv + others
    assert twin_step == pytest.approx(0.011)
    assert got.probes == FIT.probes + s.sent


def test_the_busy_overhead_is_the_ttft_left_after_the_steps() -> None:
    s = _steady(step_s=0.011, ttft_s=0.05)
    got = with_busy(FIT, s)
    own = math.hypot(0.011, 256 / 10_000.0)
    assert got.busy_overhead_s is not None
    assert got.busy_overhead_s.value == pytest.approx(0.05 - 0.011 - own)
    assert got.scrape_s is not None and got.scrape_s.value == 0.03


def test_a_fast_busy_replica_keeps_its_idle_overhead_and_no_negative_slope() -> None:
    """A steady step below the lone one (noise) is no slope; a TTFT the steps explain is
    the idle overhead, never less; no scrape answered is none."""
    got = with_busy(FIT, _steady(step_s=0.003, ttft_s=0.005, scrape_s=None))
    assert got.step_per_seq_s.value == 0.0
    assert got.busy_overhead_s is not None
    assert got.busy_overhead_s.value == FIT.overhead_s.value
    assert got.scrape_s is None
