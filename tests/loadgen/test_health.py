"""Generator self-health thresholds, with hand-computed figures."""

from __future__ import annotations

from lbtune.loadgen.health import assess, percentile, summarize


def test_percentile_linear() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None


def test_healthy_and_degraded() -> None:
    assert assess([0.001] * 100, [0.0005] * 100, [50.0, 60.0]) == (False, [])
    degraded, why = assess([0.001] * 98 + [0.05, 0.05], [0.0] * 10, [10.0])
    assert degraded and "lateness" in why[0]
    degraded, why = assess([], [0.02] * 10, [10.0])
    assert degraded and "loop lag" in why[0].replace("event-loop", "loop")
    # The first CPU sample (start-up) does not count.
    assert assess([], [], [100.0, 50.0, 50.0]) == (False, [])
    degraded, why = assess([], [], [10.0, 95.0, 95.0])
    assert degraded and "CPU" in why[0]


def test_cap_hits_degrade() -> None:
    w = summarize("w0", [0.0], [0.0], [], cap_hits=3)
    assert w.degraded and "in-flight cap" in w.reasons[0]
