"""SM activity: the arithmetic share of a step's time, exported as DCGM_FI_PROF_SM_ACTIVE."""

from __future__ import annotations

import pytest

from lbtune.sim import costmodel as cm
from lbtune.sim.engine import Engine, SimRequest
from lbtune.sim.host import HostThread
from lbtune.sim.metrics import LevelClock, ReplicaMetrics
from lbtune.sim.profiles import get_gpu, get_model
from tests.sim.conftest import http
from tests.sim.test_metrics import family, scrape

H100 = get_gpu("h100-80g")
L4 = get_gpu("l4-24g")
M8 = get_model("llama-3.1-8b-instruct")
GPU_LABELS = frozenset({("gpu", "0"), ("modelName", "h100-80g")})


def test_decode_at_batch_1_is_memory_bound_and_a_prefill_chunk_compute_bound() -> None:
    decode = cm.step_cost(H100, [(M8, cm.request_load(512, 1))])
    # ~2 * 8e9 FLOPs against ~6 ms of streamed weights
    assert decode.duration == pytest.approx(cm.decode_step_time(H100, M8, 512))
    assert 0.0 < decode.activity < 0.01
    prefill = cm.step_cost(H100, [(M8, cm.request_load(0, 1024))])
    assert prefill.duration == pytest.approx(cm.prefill_step_time(H100, M8, 1024))
    assert 0.75 < prefill.activity < 1.0  # near the ridge: weight streaming still shows
    linear = 2 * M8.linear_params * 1024 / H100.effective_flops
    lm_head = 2 * M8.lm_head_params / H100.effective_flops
    attention = (1024 * 1025 / 2) * M8.attn_flops_per_pair / H100.effective_causal_flops
    assert prefill.compute_s == pytest.approx(linear + lm_head + attention)


def test_activity_grows_with_batch_and_is_a_fraction() -> None:
    decodes = [cm.step_cost(L4, [(M8, cm.ModelLoad(b, b * 600, b * 600.0))]) for b in (1, 16, 64)]
    activities = [c.activity for c in decodes]
    assert activities == sorted(activities) and activities[0] < 0.01 < activities[-1]
    idle = cm.step_cost(H100, [(M8, cm.ModelLoad(0))])
    assert (idle.duration, idle.compute_s, idle.activity) == (0.0, 0.0, 0.0)
    for c in (*decodes, cm.step_cost(H100, [(M8, cm.request_load(20000, 2048))])):
        assert 0.0 <= c.activity <= 1.0 and c.compute_s <= c.duration


def test_engine_steps_carry_their_activity() -> None:
    engine = Engine(H100, [M8])
    engine.add_request(SimRequest("a", M8.name, list(range(1024)), 2))
    prefill, decode = engine.step(), engine.step()
    assert prefill.activity > 0.75 and decode.activity < 0.01
    assert prefill.compute_s == pytest.approx(
        cm.step_cost(H100, [(M8, cm.request_load(0, 1024))]).compute_s
    )
    assert engine.step().activity == 0.0  # nothing left: idle


def test_level_clock_is_time_weighted_and_idle_counts_zero() -> None:
    clock = LevelClock()
    t0 = clock._snapshots[0][0]
    clock.set(t0, 0.9)  # a prefill-heavy step for 0.2 s
    clock.set(t0 + 0.2, 0.1)  # decodes for 0.3 s
    clock.set(t0 + 0.5, 0.0)  # idle for 0.5 s
    assert clock.average(t0 + 1.0) == pytest.approx(0.9 * 0.2 + 0.1 * 0.3)
    assert clock.average(t0 + 2.0) == 0.0  # idle all the last interval
    clock.set(t0 + 2.0, 1.5)  # clamped to 1
    assert clock.average(t0 + 2.5) == pytest.approx(1.0)


def test_exported_gauge_name_type_labels_and_range() -> None:
    m = ReplicaMetrics([M8.name], "h100-80g")
    t0 = m.sm_active._snapshots[0][0]
    engine = Engine(H100, [M8])
    m.sm_active.set(t0, 0.4)
    m.sm_active.set(t0 + 0.5, 0.0)
    text = m.render(engine, now=t0 + 1.0)
    assert "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n" in text
    assert 'DCGM_FI_PROF_SM_ACTIVE{gpu="0",modelName="h100-80g"} 0.2\n' in text


def test_scraped_from_a_live_replica(sim: HostThread) -> None:
    types, samples = scrape(sim, "a")
    assert types["DCGM_FI_PROF_SM_ACTIVE"] == "gauge"
    (labels, value), *_ = family(samples, "DCGM_FI_PROF_SM_ACTIVE").items()
    assert labels == GPU_LABELS and 0.0 <= value <= 1.0
    assert list(family(samples, "DCGM_FI_PROF_SM_ACTIVE")) == [GPU_LABELS]


def test_a_long_prefill_moves_the_scraped_gauge(sim: HostThread) -> None:
    scrape(sim, "b")  # the next scrape's interval starts at or before this one
    status, body, _ = http(
        sim.urls["b"] + "/v1/completions",
        {"model": M8.name, "prompt": "lorem ipsum " * 800, "max_tokens": 2},
    )
    assert status == 200, body
    _, samples = scrape(sim, "b")
    (value,) = family(samples, "DCGM_FI_PROF_SM_ACTIVE").values()
    assert 0.0 < value <= 1.0
