"""Load plans: closed-loop users over time, open-loop arrivals, overrides."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from lbtune.errors import ConfigError
from lbtune.scenario import load_scenario, plan_load, scenario_from_dict
from tests.scenario.conftest import base


def _sc(load: dict[str, Any], **over: Any) -> Any:
    return scenario_from_dict(base(load=load, **over))


def test_poisson_count_rate_and_determinism() -> None:
    sc = _sc({"type": "rate", "rate": 20}, duration_s=50, seed=11)
    plan = plan_load(sc)
    n = len(plan.arrivals)
    assert plan.mode == "open" and plan.arrival == "poisson"
    assert abs(n - 1000) < 4 * math.sqrt(1000)
    assert list(plan.arrivals) == sorted(plan.arrivals)
    assert plan.arrivals[0] >= 0 and plan.arrivals[-1] < 50
    gaps = [b - a for a, b in itertools.pairwise(plan.arrivals)]
    mean = sum(gaps) / len(gaps)
    assert mean == pytest.approx(1 / 20, rel=0.1)
    cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean
    assert cv == pytest.approx(1.0, abs=0.1)
    assert plan_load(sc).arrivals == plan.arrivals
    assert plan_load(sc, seed=12).arrivals != plan.arrivals
    assert plan.users_at(10) == 0 and plan.rate_at(10) == 20


def test_constant_and_gamma_arrivals() -> None:
    const = plan_load(_sc({"type": "rate", "rate": 4, "arrival": "constant"}, duration_s=10))
    assert const.arrivals == pytest.approx([k * 0.25 for k in range(40)])
    gamma = plan_load(_sc({"type": "rate", "rate": 50, "arrival": "gamma", "cv": 3}, seed=1))
    gaps = [b - a for a, b in itertools.pairwise(gamma.arrivals)]
    mean = sum(gaps) / len(gaps)
    cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean
    assert mean == pytest.approx(0.02, rel=0.15)
    assert cv > 2  # bursty
    assert gamma.cv == 3


def test_rate_steps_follow_each_step() -> None:
    plan = plan_load(load_scenario("ramp"))
    assert plan.mode == "open" and plan.duration_s == 60
    assert [s.rate for s in plan.stages] == [1, 2, 3, 4, 6, 8]
    for s in plan.stages:
        n = sum(s.start_s <= t < s.end_s for t in plan.arrivals)
        expected = (s.rate or 0) * (s.end_s - s.start_s)
        assert abs(n - expected) <= 4 * math.sqrt(expected) + 1


def test_steps_users_at() -> None:
    steps = [{"users": 2, "duration": 10}, {"users": 5, "duration": 10, "label": "hi"}]
    plan = plan_load(_sc({"type": "steps", "steps": steps}, duration_s=30))
    assert [(s.start_s, s.end_s, s.users, s.label) for s in plan.stages] == [
        (0, 10, 2, "step1"),
        (10, 30, 5, "hi"),
    ]
    assert [plan.users_at(t) for t in (0, 9.9, 10, 29.9, 30, -1)] == [2, 2, 5, 5, 0, 0]
    assert plan.arrivals == () and plan.max_users == 5


def test_spike_users_at_and_labels() -> None:
    plan = plan_load(load_scenario("surge"))
    assert [s.label for s in plan.stages] == ["steady", "spike", "recovery"]
    assert [plan.users_at(t) for t in (0, 19.9, 20, 34.9, 35, 59)] == [6, 6, 50, 50, 6, 6]
    spike = plan.stages[1]
    assert (spike.start_s, spike.end_s) == (20, 35)
    assert plan.measure_window == (5, 58)


def test_ramp_users_at_interpolates() -> None:
    plan = plan_load(_sc({"type": "ramp", "from": 0, "to": 10, "over": 10}, duration_s=20))
    assert [plan.users_at(t) for t in (0, 5, 9.99, 15)] == [0, 5, 10, 10]
    assert plan.stages[0].ramp_from == 0 and plan.stages[0].users == 10


def test_open_ramp_arrivals_increase() -> None:
    sc = _sc({"type": "ramp", "from": 0, "to": 40, "over": 20, "mode": "open"}, duration_s=20)
    plan = plan_load(sc)
    first = sum(t < 10 for t in plan.arrivals)
    second = sum(t >= 10 for t in plan.arrivals)
    assert first + second == pytest.approx(400, abs=80)
    assert second / max(first, 1) == pytest.approx(3, rel=0.3)  # ∫ linear rate


def test_overrides_scale_and_stretch() -> None:
    surge = load_scenario("surge")
    plan = plan_load(surge, users=12, duration_s=120)
    assert [s.users for s in plan.stages] == [12, 100, 12]
    assert [(s.start_s, s.end_s) for s in plan.stages] == [(0, 40), (40, 70), (70, 120)]
    assert plan.warmup_s == surge.warmup_s
    as_rate = plan_load(surge, rate=2)
    assert as_rate.mode == "open" and [s.rate for s in as_rate.stages] == pytest.approx(
        [2, 2 * 50 / 6, 2]
    )
    ramp = plan_load(load_scenario("ramp"), rate=16)
    assert [s.rate for s in ramp.stages] == [2, 4, 6, 8, 12, 16]
    chat = plan_load(load_scenario("chat"), users=3)
    assert chat.users_at(1) == 3


def test_override_errors() -> None:
    chat = load_scenario("chat")
    with pytest.raises(ConfigError, match="not both"):
        plan_load(chat, users=1, rate=1)
    with pytest.raises(ConfigError, match="--rate: must be > 0"):
        plan_load(chat, rate=-1)
    short = plan_load(chat, duration_s=10)  # warm-up and cool-down shrink with the test
    assert short.warmup_s == pytest.approx(chat.warmup_s * 10 / chat.duration_s)
    assert short.cooldown_s == pytest.approx(chat.cooldown_s * 10 / chat.duration_s)
    long = plan_load(chat, duration_s=chat.duration_s * 2)  # ... and keep their seconds
    assert (long.warmup_s, long.cooldown_s) == (chat.warmup_s, chat.cooldown_s)


def test_a_hold_keeps_the_last_level_until_its_bound() -> None:
    ramp = _sc(
        {"type": "ramp", "from": 2, "to": 8, "over": 10, "mode": "open"},
        duration_s=20,
        warmup_s=2,
        cooldown_s=1,
    )
    plain = plan_load(ramp)
    held = plan_load(ramp, hold_until_s=50)
    assert held.duration_s == 50 and held.stages[-1].label == "hold"
    assert held.stages[-1].start_s == 20 and held.stages[-1].rate == pytest.approx(8)
    assert held.measure_window == (2, 49)  # the cool-down comes at the bound
    assert held.rate_at(35) == pytest.approx(8) and held.rate_at(5) == plain.rate_at(5)
    # The shape's own arrivals are unchanged; the hold adds ~8/s after it.
    assert held.arrivals[: len(plain.arrivals)] == pytest.approx(plain.arrivals)
    extra = len(held.arrivals) - len(plain.arrivals)
    assert abs(extra - 240) < 5 * math.sqrt(240)
    closed = plan_load(_sc({"type": "constant", "users": 4}, duration_s=10), hold_until_s=30)
    assert closed.users_at(25) == 4 and closed.users_at(30) == 0
    assert plan_load(ramp, hold_until_s=5) == plain  # a bound inside the test holds nothing
