"""Parameter spaces: loading, expansion, validation errors, baseline, Optuna suggestions."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.errors import ConfigError
from lbtune.targets.haproxy.target import SPACE_FILE
from lbtune.targets.space import IDLE_REASON, ParameterSpace, SpaceFile, load_params_file

REPLICAS = ["h100-0", "l4-0"]


@pytest.fixture(scope="module")
def space() -> ParameterSpace:
    return ParameterSpace.load(SPACE_FILE, replicas=REPLICAS)


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_haproxy_space_expands_per_server_knobs_and_has_a_valid_baseline(
    space: ParameterSpace,
) -> None:
    assert space.target == "haproxy"
    assert {"weight.h100-0", "weight.l4-0", "maxconn.h100-0", "maxconn.l4-0"} <= set(space.names)
    assert "weight" not in space.names
    base = space.baseline()
    assert base["weight.h100-0"] == 100 and base["maxconn.l4-0"] == 0
    assert base["algorithm"] == "roundrobin" and base["queue_timeout_s"] == 60
    assert space.validate(base) == base
    assert ParameterSpace.load(SPACE_FILE).names[0] == "algorithm"  # no replicas: no per-server


def test_unknown_knob_names_the_file_the_knob_and_the_available_ones(
    space: ParameterSpace,
) -> None:
    with pytest.raises(ConfigError) as exc:
        space.validate({"weight.h100-9": 5}, source="examples/bad.yaml")
    msg = str(exc.value)
    assert msg.startswith(
        "examples/bad.yaml: weight.h100-9: unknown knob; available: weight.h100-0"
    )
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("knob", "value", "expected"),
    [
        ("weight.h100-0", 300, "300 is out of range; expected an integer in 0..256"),
        ("weight.h100-0", 1.5, "got 1.5; expected an integer in 0..256"),
        ("weight.h100-0", True, "got True; expected an integer in 0..256"),
        ("weight.h100-0", "50", "got '50'; expected an integer in 0..256"),
        ("algorithm", "hashh", "got 'hashh'; expected one of roundrobin, leastconn, random, hash"),
        ("hash_balance_factor", 152, "expected an integer in 105..400 in steps of 5"),
        ("agent.a", "x", "expected a number in 0..1"),
    ],
)
def test_wrong_types_and_ranges_name_the_knob_and_the_allowed_range(
    space: ParameterSpace, knob: str, value: object, expected: str
) -> None:
    with pytest.raises(ConfigError, match=rf"^{knob}: .*") as exc:
        space.validate({knob: value})
    assert expected in str(exc.value)


def test_values_are_coerced_to_the_knobs_type(space: ParameterSpace) -> None:
    out = space.validate({"weight.l4-0": 7.0, "agent.a": 1})
    assert out == {"weight.l4-0": 7, "agent.a": 1.0}
    assert type(out["weight.l4-0"]) is int and type(out["agent.a"]) is float


def test_conditions_and_completion(space: ParameterSpace) -> None:
    assert not space.is_active("hash_bytes", {"algorithm": "roundrobin"})
    assert space.is_active("hash_bytes", {"algorithm": "hash"})
    assert space.is_active("random_draws", {"algorithm": "random"})
    full = space.complete({"weight.l4-0": 3}, {"weight.h100-0": 9, "not-a-knob": 1})
    assert full["weight.l4-0"] == 3 and full["weight.h100-0"] == 9 and "not-a-knob" not in full
    assert set(full) == set(space.names)


def test_suggest_samples_only_active_knobs_and_stays_in_the_space(space: ParameterSpace) -> None:
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(20):
        trial = study.ask()
        params = space.suggest(trial)
        assert space.validate(params) == params
        sampled = set(trial.params)
        if params["algorithm"] != "hash":
            assert "hash_bytes" not in sampled and "hash_balance_factor" not in sampled
        if params["algorithm"] != "random":
            assert "random_draws" not in sampled
        # The LLM scheduler picks its server itself: weights act under every other one.
        assert ("weight.h100-0" in sampled) == (params["algorithm"] != "llm")
        assert space.is_active("weight.h100-0", params) == (params["algorithm"] != "llm")
        study.tell(trial, 0.0)
    assert any(t.params.get("algorithm") == "llm" for t in study.trials)


def test_a_condition_sees_the_sampled_value_whatever_the_file_order() -> None:
    """``weight`` comes before ``algorithm`` in the file; its condition on ``algorithm`` is
    judged on the sampled algorithm, not on the baseline (the knobs a ``when`` names are
    sampled first), and a knob that depends on an inactive knob is inactive too."""
    optuna = pytest.importorskip("optuna")
    doc = SpaceFile.model_validate(
        {
            "target": "x",
            "params": {
                "w": {"type": "int", "low": 1, "high": 9, "baseline": 5,
                      "when": {"algo": ["rr", "lc"]}},
                "algo": {"type": "categorical", "choices": ["rr", "lc", "llm"], "baseline": "rr"},
                "x": {"type": "int", "low": 1, "high": 9, "baseline": 1, "when": {"w": 9}},
            },
        }
    )  # fmt: skip
    space = ParameterSpace.from_file(doc)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        params = space.suggest(trial)
        seen.add(params["algo"])
        assert ("w" in trial.params) == (params["algo"] != "llm")
        study.tell(trial, 0.0)
    assert seen == {"rr", "lc", "llm"}
    active, inactive = space.split({"w": 9, "algo": "llm", "x": 3})
    assert active == {"algo": "llm"}
    assert inactive == {"w": "acts only when algo = rr/lc", "x": "acts only when w = 9"}
    assert ParameterSpace(space.target, space.params, idle=["algo"]).split({"algo": "rr"}) == (
        {},
        {"algo": IDLE_REASON},
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "target: x\nparams:\n  k: {type: int, low: 0, high: 5, baseline: 9}\n",
            "baseline 9: 9 is out of range",
        ),
        (
            "target: x\nparams:\n  k: {type: int, low: 0, high: 5, baseline: 1, typo: 1}\n",
            "params.k.typo: unknown field",
        ),
        (
            "target: x\nparams:\n  k: {type: categorical, baseline: a}\n",
            "non-empty list of choices",
        ),
        (
            "target: x\nparams:\n  k: {type: int, low: 1, high: 5, baseline: 1, when: {nope: 1}}\n",
            "refers to unknown knob 'nope'",
        ),
        (
            "target: x\nparams:\n  k: {type: float, low: 0, high: 5, log: true, baseline: 1}\n",
            "log scale needs low > 0",
        ),
    ],
)
def test_invalid_space_files_name_the_file_and_the_field(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=str(path)) as exc:
        ParameterSpace.load(path)
    assert expected in str(exc.value)


def test_params_file_accepts_a_flat_mapping_or_the_show_format(tmp_path: Path) -> None:
    flat = write(tmp_path, "weight.h100-0: 5\n", "a.yaml")
    shown = write(tmp_path, "target: haproxy\nparams:\n  weight.h100-0: 5\n", "b.yaml")
    assert load_params_file(flat) == load_params_file(shown) == {"weight.h100-0": 5}
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_params_file(write(tmp_path, "- 1\n", "c.yaml"))


def test_example_parameter_files_validate_against_hetero4() -> None:
    space = ParameterSpace.load(SPACE_FILE, replicas=["h100-0", "h100-1", "a100-0", "l4-0"])
    root = Path(__file__).resolve().parents[2] / "examples"
    for name in ("weights.yaml", "hash.yaml"):
        space.validate(load_params_file(root / name), source=name)
