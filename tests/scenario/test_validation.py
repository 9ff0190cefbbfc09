"""Scenario files: built-ins validate; bad input is one ConfigError naming file and field."""

from __future__ import annotations

from typing import Any

import pytest

from lbtune.errors import ConfigError
from lbtune.scenario import builtin_names, list_scenarios, load_scenario, scenario_from_dict
from tests.scenario.conftest import base

BUILTINS = ["agent", "chat", "longctx", "mixed", "prefix", "ramp", "surge"]


def test_builtins_present_and_valid() -> None:
    assert builtin_names() == BUILTINS
    for sc in list_scenarios():
        assert sc.duration_s <= 60
        assert sc.slo.ttft and sc.slo.e2e and sc.slo.itl
        assert sc.warmup_s > 0 and sc.cooldown_s > 0
        assert sc.ignore_eos
        assert "seed" in sc.model_fields_set
        assert set(sc.model_names()) <= {"llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq"}


def test_builtin_shapes() -> None:
    surge = load_scenario("surge")
    assert surge.load.type == "spike"
    assert surge.load.peak / surge.load.base == pytest.approx(8.3, abs=0.05)
    ramp = load_scenario("ramp")
    assert ramp.mode == "open" and ramp.load.type == "steps"
    mixed = load_scenario("mixed")
    assert len(mixed.model_names()) == 2 and mixed.priority
    assert mixed.models["llama-3.1-8b-instruct"] > mixed.models["llama-3.1-70b-instruct-awq"]


def test_unknown_name_lists_available() -> None:
    with pytest.raises(ConfigError, match=r"Unknown scenario 'nope'\. Available: agent, chat"):
        load_scenario("nope")


def test_load_by_path(write: Any) -> None:
    assert load_scenario(write(base(), "mine")).name == "t"
    data = base()
    del data["name"]
    assert load_scenario(write(data, "stem")).name == "stem"


@pytest.mark.parametrize(
    ("over", "expected"),
    [
        ({"bogus": 1}, r"x\.yaml: bogus: unknown field; valid fields: name, description"),
        (
            {"load": {"type": "rate", "rate": -1}},
            r"x\.yaml: load\.rate: must be > 0 \(got -1\)",
        ),
        (
            {"load": {"type": "rate", "rat": 3}},
            r"load\.rat: unknown field; valid fields: type, arrival, cv, rate",
        ),
        ({"load": {"type": "wave"}}, r"load: unknown type 'wave'; expected one of: 'constant'"),
        (
            {"prompt_tokens": {"type": "uniform", "min": 50, "max": 10}},
            r"prompt_tokens: min \(50\) must be <= max \(10\)",
        ),
        (
            {"prompt_tokens": {"type": "empirical", "percentiles": {0: 1, 90: 500, 68: 900}}},
            r"prompt_tokens: percentiles must increase: 68 follows 90",
        ),
        (
            {"output_tokens": {"type": "fixed", "value": -5}},
            r"output_tokens\.value: must be >= 1 \(got -5\)",
        ),
        ({"models": {}}, r"models: must not be empty"),
        ({"models": {"m": 0}}, r"models\.m: must be > 0"),
        (
            {"load": {"type": "steps", "steps": [{"rate": 1, "duration": 5}, {"users": 2}]}},
            r"load\.steps\[1\]\.duration: required field is missing",
        ),
        (
            {"load": {"type": "spike", "base": 5, "peak": 2, "at": 1, "for": 2}},
            r"load: peak \(2\) must be above base \(5\)",
        ),
        (
            {"duration_s": 10, "load": {"type": "spike", "base": 1, "peak": 2, "at": 8, "for": 5}},
            r"load: the spike shape needs 13 s, more than duration_s \(10 s\)",
        ),
        ({"slo": {"ttft": "fast"}}, r"slo\.ttft: expected seconds or a duration like '350ms'"),
        (
            {"classes": [{"name": "a", "weight": 1, "prompt_tokens": {"type": "fixed"}}]},
            r"classes\[0\]\.prompt_tokens\.value: required field is missing",
        ),
        (
            {"load": {"type": "rate", "rate": 1, "arrival": "gamma"}},
            r"load: arrival gamma needs cv",
        ),
    ],
)
def test_errors_name_file_and_field(write: Any, over: dict[str, Any], expected: str) -> None:
    path = write(base(**over))
    with pytest.raises(ConfigError, match=expected) as info:
        load_scenario(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: ")


def test_yaml_syntax_and_non_mapping(write: Any) -> None:
    with pytest.raises(ConfigError, match=r"x\.yaml: invalid YAML at line \d+"):
        load_scenario(write("a: 1\nb: [\n"))
    with pytest.raises(ConfigError, match=r"x\.yaml: expected a mapping.*found list"):
        load_scenario(write("- 1\n"))
    with pytest.raises(ConfigError, match="no such scenario file"):
        load_scenario("does/not/exist.yaml")


def test_slo_units_and_lognormal_forms() -> None:
    sc = scenario_from_dict(
        base(
            slo={"ttft": "350ms", "e2e": 2, "itl": "0.05s"},
            prompt_tokens={"type": "lognormal", "mean": 200, "std": 100},
        )
    )
    assert sc.slo.ttft == pytest.approx(0.35) and sc.slo.e2e == 2
    assert sc.slo.itl == pytest.approx(0.05)
    with pytest.raises(ConfigError, match="either median and sigma, or mean and std"):
        scenario_from_dict(base(prompt_tokens={"type": "lognormal", "median": 100}))


def test_steps_duration_defaults_to_total() -> None:
    steps = {"type": "steps", "steps": [{"users": 1, "duration": 5}, {"users": 3, "duration": 7}]}
    assert scenario_from_dict(base(load=steps)).duration_s == 12
