"""Scoring and guard rails: pure functions, hand-computed expectations."""

from __future__ import annotations

from typing import Any

import pytest

from lbtune.agent.config import AgentConfig
from lbtune.agent.scoring import (
    AgentState,
    Decision,
    Normalised,
    ReplicaInputs,
    SeriesState,
    ewma,
    normalise,
    score,
    smooth,
    step,
    target_weights,
    zscore,
)

CFG = AgentConfig()  # a/b/c 0.5/0.3/0.2, ttft ceiling 1 s, queue ceiling 16, max 100, step 32
IDLE = ReplicaInputs(kv_usage=0.0, waiting=0, running=0)


def cfg(**kw: Any) -> AgentConfig:
    return AgentConfig(**kw)


def by_name(decisions: list[Decision]) -> dict[str, Decision]:
    return {d.replica: d for d in decisions}


def test_normalise_against_ceilings() -> None:
    n = normalise(ReplicaInputs(kv_usage=0.4, waiting=4, running=3, ttft_p50_s=0.5), CFG)
    assert n == Normalised(kv=0.4, latency=0.5, queue=0.25)
    n = normalise(ReplicaInputs(kv_usage=1.3, waiting=40, running=3, ttft_p50_s=2.5), CFG)
    assert n == Normalised(kv=1.0, latency=1.0, queue=1.0)
    # p90 chosen by config
    raw = ReplicaInputs(kv_usage=0.0, waiting=0, running=1, ttft_p50_s=0.1, ttft_p90_s=0.8)
    assert normalise(raw, cfg(ttft_quantile="p90")) == Normalised(kv=0.0, latency=0.8, queue=0.0)


def test_no_ttft_means_idle_zero_or_busy_unknown() -> None:
    assert normalise(IDLE, CFG) == Normalised(kv=0.0, latency=0.0, queue=0.0)
    busy = ReplicaInputs(kv_usage=0.2, waiting=0, running=2)
    assert normalise(busy, CFG) == Normalised(kv=0.2, latency=None, queue=0.0)
    assert normalise(ReplicaInputs(kv_usage=None, waiting=0), CFG) is None
    assert normalise(ReplicaInputs(kv_usage=0.1, waiting=None), CFG) is None


def test_score_is_the_source_formula() -> None:
    # 0.5*(1-0.4) + 0.3*(1-0.5) + 0.2*(1-0.25) = 0.3 + 0.15 + 0.15
    assert score(Normalised(kv=0.4, latency=0.5, queue=0.25), CFG) == pytest.approx(0.6)
    assert score(Normalised(kv=0.0, latency=0.0, queue=0.0), CFG) == pytest.approx(1.0)
    assert score(Normalised(kv=1.0, latency=1.0, queue=1.0), CFG) == pytest.approx(0.0)
    assert score(Normalised(kv=0.0, latency=1.0, queue=0.0), cfg(a=1, b=1, c=0)) == 1.0


def test_ewma() -> None:
    assert ewma(None, 0.4, 0.5) == 0.4
    assert ewma(0.4, 0.8, 0.5) == pytest.approx(0.6)
    assert ewma(0.4, 0.8, 0.25) == pytest.approx(0.5)
    assert ewma(0.4, 0.8, 1.0) == pytest.approx(0.8)


def test_zscore_with_a_sigma_floor() -> None:
    assert zscore((0.1, 0.1), 5.0, 0.02) is None  # fewer than 3 samples: no filter
    assert zscore((0.1, 0.1, 0.1), 0.2, 0.02) == pytest.approx(5.0)  # std 0 → floor 0.02
    assert zscore((0.1, 0.1, 0.1), 0.16, 0.02) == pytest.approx(3.0)
    # mean 0.2, population std sqrt(0.02/3) = 0.08165
    assert zscore((0.1, 0.2, 0.3), 0.5, 0.0) == pytest.approx(3.674, abs=1e-3)
    assert zscore((0.1, 0.2, 0.3), 0.48, 0.0) == pytest.approx(3.429, abs=1e-3)
    assert zscore((0.1, 0.1, 0.1), 0.1, 0.0) == 0.0


def test_a_spike_is_dropped_and_the_previous_value_kept() -> None:
    s = SeriesState(ewma=0.1, window=(0.1, 0.2, 0.3))
    new, value, dropped = smooth(s, 0.5, CFG)  # z = 3.67 > 3.5
    assert dropped and value == 0.1
    assert new == SeriesState(ewma=0.1, window=(0.1, 0.2, 0.3), drops=1)
    new, value, dropped = smooth(s, 0.48, CFG)  # z = 3.43: accepted, EWMA 0.5/0.5
    assert not dropped and value == pytest.approx(0.29)
    assert new.window == (0.1, 0.2, 0.3, 0.48) and new.drops == 0


def test_a_level_shift_is_accepted_after_max_drops() -> None:
    s = SeriesState(ewma=0.1, window=(0.1, 0.1, 0.1))
    s, v1, d1 = smooth(s, 0.9, CFG)
    s, v2, d2 = smooth(s, 0.9, CFG)
    s, v3, d3 = smooth(s, 0.9, CFG)
    assert (d1, d2, d3) == (True, True, False)
    assert (v1, v2) == (0.1, 0.1)
    assert v3 == pytest.approx(0.5)  # 0.5*0.9 + 0.5*0.1
    assert s.window == (0.9,) and s.drops == 0


def test_the_window_keeps_the_last_z_window_samples() -> None:
    c = cfg(z_window=3, ewma_alpha=1.0)
    s = SeriesState()
    for x in (0.1, 0.11, 0.12, 0.13):
        s, v, _ = smooth(s, x, c)
    assert s.window == (0.11, 0.12, 0.13) and v == 0.13


def test_target_weights_scale_to_the_best_and_clamp_at_min() -> None:
    assert target_weights({"a": 0.8, "b": 0.4, "c": 0.0}, CFG) == {"a": 100, "b": 50, "c": 1}
    assert target_weights({"a": 0.8, "b": 0.41}, cfg(max_weight=256)) == {"a": 256, "b": 131}
    assert target_weights({"a": 0.0, "b": 0.0}, CFG) == {"a": 100, "b": 100}
    assert target_weights({"a": 0.9, "b": 0.04}, cfg(min_weight=10)) == {"a": 100, "b": 10}
    assert target_weights({}, CFG) == {}


SLOW = ReplicaInputs(kv_usage=0.6, waiting=8, running=4, ttft_p50_s=1.0)
# kv 0.6, latency 1, queue 0.5 → 0.5*0.4 + 0 + 0.2*0.5 = 0.3 → target 30 (idle peer: 1.0)


def test_max_step_limits_each_change() -> None:
    state = AgentState()
    current = {"fast": 100, "slow": 100}
    inputs = {"fast": IDLE, "slow": SLOW}
    weights = []
    for _ in range(3):
        state, decisions = step(CFG, state, inputs, current)
        d = by_name(decisions)
        assert d["fast"].weight == 100 and not d["fast"].changed
        assert d["slow"].score == pytest.approx(0.3) and d["slow"].target == 30
        weights.append(d["slow"].weight)
        current = {r: x.weight for r, x in d.items()}
    assert weights == [68, 36, 30]
    first = by_name(step(CFG, AgentState(), inputs, {"fast": 100, "slow": 100})[1])
    assert first["slow"].reasons == ("score", "max_step")


def test_min_weight_is_a_floor() -> None:
    c = cfg(min_weight=20, max_step=256)
    dead = ReplicaInputs(kv_usage=0.9, waiting=16, running=9, ttft_p50_s=3.0)  # score 0.05
    _, decisions = step(c, AgentState(), {"ok": IDLE, "bad": dead}, {"ok": 100, "bad": 100})
    d = by_name(decisions)["bad"]
    assert d.score == pytest.approx(0.05) and d.weight == 20
    assert d.reasons == ("score", "min_weight")


def test_changes_below_the_deadband_are_not_made() -> None:
    near = ReplicaInputs(kv_usage=0.02, waiting=0, running=1, ttft_p50_s=0.0)  # score 0.99
    _, decisions = step(CFG, AgentState(), {"a": IDLE, "b": near}, {"a": 100, "b": 100})
    assert by_name(decisions)["b"].weight == 100
    assert by_name(decisions)["b"].reasons == ("score", "deadband")
    _, decisions = step(cfg(deadband=0), AgentState(), {"a": IDLE, "b": near}, {"a": 100, "b": 100})
    assert by_name(decisions)["b"].weight == 99
    _, decisions = step(CFG, AgentState(), {"a": IDLE, "b": near}, {"a": 100, "b": 97})
    assert by_name(decisions)["b"].weight == 99  # a change of 2 is made


def test_drain_above_threshold_with_hysteresis() -> None:
    c = cfg(drain_kv_threshold=0.95, recover_kv_threshold=0.8)
    state, current = AgentState(), {"x": 100, "y": 100}
    seen = []
    for kv in (0.5, 0.96, 0.9, 0.85, 0.8, 0.8):
        y = ReplicaInputs(kv_usage=kv, waiting=0, running=1, ttft_p50_s=0.0)
        state, decisions = step(c, state, {"x": IDLE, "y": y}, current)
        d = by_name(decisions)["y"]
        seen.append((d.weight, [r for r in d.reasons if r not in ("score", "spike")]))
        current = {r.replica: r.weight for r in decisions}
    # kv 0.5, idle otherwise: 0.5*0.5 + 0.3 + 0.2 = 0.75 → 75
    assert [w for w, _ in seen[:4]] == [75, 0, 0, 0]
    assert [r for _, r in seen] == [
        [],
        ["drain"],
        ["draining"],
        ["draining"],
        ["recover", "max_step"],
        [],
    ]
    # From 0 back up by at most max_step; smoothed kv 0.808 → score 0.596 → 60.
    assert seen[4][0] == 32 and seen[5][0] == 60
    assert "y" not in state.drained


def test_drain_uses_the_raw_kv_even_when_the_sample_looks_like_a_spike() -> None:
    state, current = AgentState(), {"x": 100, "y": 100}
    calm = ReplicaInputs(kv_usage=0.3, waiting=0, running=1, ttft_p50_s=0.1)
    for _ in range(4):
        state, _ = step(CFG, state, {"x": IDLE, "y": calm}, current)
    full = ReplicaInputs(kv_usage=0.99, waiting=0, running=1, ttft_p50_s=0.1)
    state, decisions = step(CFG, state, {"x": IDLE, "y": full}, current)
    d = by_name(decisions)["y"]
    assert d.weight == 0 and "drain" in d.reasons and "spike" in d.reasons
    assert d.smoothed is not None and d.smoothed.kv == pytest.approx(0.3)


def test_never_all_replicas_at_zero() -> None:
    full = ReplicaInputs(kv_usage=0.99, waiting=0, running=1)
    fuller = ReplicaInputs(kv_usage=1.0, waiting=4, running=1)
    state, decisions = step(CFG, AgentState(), {"a": fuller, "b": full}, {"a": 100, "b": 100})
    d = by_name(decisions)
    assert d["a"].weight == 0 and d["a"].reasons == ("drain",)
    assert d["b"].weight == CFG.min_weight and d["b"].reasons == ("drain", "never_all_zero")
    assert state.drained == {"a", "b"}
    # A single replica at 0 with no data is kept at the minimum too.
    _, decisions = step(CFG, AgentState(), {}, {"solo": 0})
    assert decisions[0].weight == 1 and decisions[0].reasons == ("no_data", "never_all_zero")


def test_a_replica_without_data_keeps_its_weight() -> None:
    _, decisions = step(CFG, AgentState(), {"a": IDLE, "b": None}, {"a": 100, "b": 57})
    d = by_name(decisions)
    assert d["b"].weight == 57 and d["b"].reasons == ("no_data",) and d["b"].score is None
    assert d["a"].weight == 100


def test_a_latency_spike_is_dropped_inside_step() -> None:
    state, current = AgentState(), {"x": 100, "y": 100}
    steady = ReplicaInputs(kv_usage=0.2, waiting=0, running=1, ttft_p50_s=0.2)
    for _ in range(4):
        state, decisions = step(CFG, state, {"x": IDLE, "y": steady}, current)
    before = by_name(decisions)["y"].score
    spike = ReplicaInputs(kv_usage=0.2, waiting=0, running=1, ttft_p50_s=1.0)
    state, decisions = step(CFG, state, {"x": IDLE, "y": spike}, current)
    d = by_name(decisions)["y"]
    assert "spike" in d.reasons and d.score == pytest.approx(before)
    assert d.smoothed is not None and d.smoothed.latency == pytest.approx(0.2)
    assert state.series[("y", "latency")].drops == 1


def test_busy_without_ttft_keeps_the_previous_latency() -> None:
    state, current = AgentState(), {"y": 100}
    state, _ = step(CFG, state, {"y": ReplicaInputs(0.2, 0, 1, ttft_p50_s=0.4)}, current)
    state, decisions = step(CFG, state, {"y": ReplicaInputs(0.2, 0, 1)}, current)
    assert decisions[0].smoothed == Normalised(kv=0.2, latency=0.4, queue=0.0)


def test_step_is_pure() -> None:
    state = AgentState()
    inputs = {"fast": IDLE, "slow": SLOW}
    a = step(CFG, state, inputs, {"fast": 100, "slow": 100})
    b = step(CFG, state, inputs, {"fast": 100, "slow": 100})
    assert a == b and state == AgentState()
