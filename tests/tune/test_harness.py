"""Which of the generator's reasons make a live trial untrusted (``lbtune.tune.harness``)."""

from __future__ import annotations

from lbtune.loadgen.health import GeneratorHealth, summarize
from lbtune.objective import make_spec
from lbtune.tune.harness import _untrusted

# 15-ms TTFTs, a tenth of them read late by 12 ms: the P99 bound is too wide
LATE = [(0.015, 0.0)] * 90 + [(0.03, 0.012)] * 10


def test_a_wide_ttft_bound_untrusts_a_trial_only_where_the_score_reads_ttfts() -> None:
    health = GeneratorHealth((summarize("w0", [], [], [], 0, ttfts=LATE, timings=["kernel"]),))
    assert health.degraded
    assert _untrusted(health, make_spec()) == health.reasons != ()
    assert _untrusted(health, None) == health.reasons
    assert _untrusted(health, make_spec(weights="e2e=1,ttft=0,decay=0")) == ()


def test_starved_users_untrust_any_trial() -> None:
    w = summarize("w0", [], [], [], 0, ttfts=LATE, timings=["kernel"], idle=[(1.0, 4.0)])
    health = GeneratorHealth((w,))
    e2e_only = _untrusted(health, make_spec(weights="e2e=1,ttft=0,decay=0"))
    assert e2e_only == ("w0: " + w.load_reasons[0],) and "starved" in e2e_only[0]
