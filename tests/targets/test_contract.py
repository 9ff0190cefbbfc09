"""The target contract, run against every entry of the registry (Optuna-style).

Nothing here names a balancer: each entry brings its own tiny cluster
(:attr:`~lbtune.targets.targetbase.BalancerBase.test_preset`, two replicas on free loopback ports),
so a new target passes or fails this suite as soon as it is registered. A target whose
binary is missing on this machine is skipped with the DependencyError's words.

Every target must: load its space, whose baseline validates; refuse out-of-range,
mistyped and unknown values before touching anything (``validate`` and ``apply``);
round-trip ``apply`` → ``read_live``, with a repeat reporting no change; touch nothing in
check mode and report the diff; restore the last known good on ``rollback``; and, after an
apply, serve a real request through the balancer that carries the replica header.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from lbtune.apply.runner import PLAYBOOKS_DIR
from lbtune.cluster import api
from lbtune.cluster.config import load_config
from lbtune.errors import ConfigError, DependencyError
from lbtune.records.endpoints import Endpoints
from lbtune.targets import TARGETS, balancer, get_target, names
from lbtune.targets.base import ParamSet
from lbtune.targets.lkg import LkgStore
from lbtune.targets.space import ParameterSpace
from lbtune.targets.targetbase import BalancerBase, TargetBase

# --- the registry entry (no processes) ---------------------------------------------------


@pytest.mark.parametrize("name", names())
def test_the_entry_is_a_balancer_named_as_registered(name: str) -> None:
    entry = balancer(name)
    assert isinstance(entry, BalancerBase)
    assert entry.name == name
    assert (PLAYBOOKS_DIR / "library" / f"{entry.ansible_module}.py").is_file()
    preset, _ = load_config(entry.test_preset)
    assert preset.balancer == name  # its own tiny cluster
    assert preset.ports.balancer == 0  # on free loopback ports


def test_an_unknown_name_lists_the_registered_ones() -> None:
    with pytest.raises(ConfigError) as exc:
        balancer("haprox")
    assert "'haprox'" in str(exc.value)
    assert all(n in str(exc.value) for n in TARGETS)


# --- a running balancer, per entry -------------------------------------------------------


@pytest.fixture(scope="module", params=names())
def deployed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BalancerBase, Endpoints]]:
    entry = balancer(request.param)
    state = tmp_path_factory.mktemp(request.param)
    try:
        try:
            ep = api.up(entry.test_preset, state)
        except DependencyError as exc:
            pytest.skip(f"{request.param}: {exc}")
        yield entry, ep
    finally:
        api.down(state)


@pytest.fixture
def target(deployed: tuple[BalancerBase, Endpoints]) -> TargetBase:
    """A fresh instance each test (nothing cached between tests but the balancer itself)."""
    entry, ep = deployed
    made = get_target(entry.name, ep)
    assert isinstance(made, TargetBase)
    return made


def other_params(space: ParameterSpace, seed: int = 7) -> ParamSet:
    """A valid non-baseline parameter set, sampled by the space's own Optuna helper."""
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    for _ in range(50):
        params = space.suggest(study.ask())
        if params != space.baseline():
            return params
    raise AssertionError("the space samples only its baseline")


def out_of_range(space: ParameterSpace) -> ParamSet:
    """One knob just outside what the space allows (a numeric one where there is one)."""
    for name, spec in space.params.items():
        if spec.type in ("int", "float") and spec.high is not None and spec.low is not None:
            value = spec.high + max(1.0, spec.high - spec.low)
            return {name: int(value) if spec.type == "int" else float(value)}
    for name, spec in space.params.items():
        if spec.type == "categorical":
            return {name: "no-such-choice"}
    raise AssertionError("the space has neither a numeric nor a categorical knob")


def mistyped(space: ParameterSpace) -> ParamSet:
    for name, spec in space.params.items():
        if spec.type in ("int", "float"):
            return {name: "fast"}
    return {next(iter(space.params)): [1, 2]}  # type: ignore[dict-item]


def live_subset(target: TargetBase, keys: ParamSet) -> ParamSet:
    live = target.read_live()
    return {k: live[k] for k in keys}


@pytest.mark.integration
def test_space_loads_and_its_baseline_validates(target: TargetBase) -> None:
    space = target.space()
    assert space.names
    base = space.baseline()
    assert space.validate(base) == base
    assert set(target.validate(base)) <= set(base)
    assert set(target.read_live()) == set(space.params)  # every knob is read back


@pytest.mark.integration
@pytest.mark.parametrize("make_bad", [out_of_range, mistyped, lambda s: {"no_such_knob": 1}])
def test_validate_and_apply_refuse_bad_values_before_touching_anything(
    target: TargetBase, make_bad: object
) -> None:
    assert callable(make_bad)
    bad: ParamSet = make_bad(target.space())
    before = target.read_live()
    with pytest.raises(ConfigError) as exc:
        target.validate(bad)
    assert next(iter(bad)) in str(exc.value)  # the message names the knob
    with pytest.raises(ConfigError):
        target.apply(bad)
    with pytest.raises(ConfigError):
        target.apply(bad, check=True)
    assert target.read_live() == before


@pytest.mark.integration
def test_apply_round_trips_through_read_live_and_a_repeat_is_no_change(target: TargetBase) -> None:
    params = other_params(target.space())
    first = target.apply(params)
    assert first.changed and first.diff and not first.check
    assert first.applied == target.read_live()
    assert live_subset(target, params) == params
    again = target.apply(params)
    assert not again.changed and again.diff == {}
    assert target.apply(target.read_live()).changed is False


@pytest.mark.integration
def test_check_mode_reports_the_diff_and_touches_nothing(target: TargetBase) -> None:
    before = target.read_live()
    wanted = {k: v for k, v in other_params(target.space(), seed=11).items() if before[k] != v}
    assert wanted, "the sampled set equals what is live"
    result = target.apply(wanted, check=True)
    assert result.check and result.changed
    assert {k: after for k, (_, after) in result.diff.items()} == wanted
    assert {k: b for k, (b, _) in result.diff.items()} == {k: before[k] for k in wanted}
    assert target.read_live() == before
    assert target.apply(before, check=True).changed is False


@pytest.mark.integration
def test_rollback_restores_the_last_known_good(target: TargetBase) -> None:
    base = target.space().baseline()
    target.apply(base)
    LkgStore(target.state_dir, target.name).record(target.read_live(), "contract test")
    target.apply(other_params(target.space(), seed=3))
    assert live_subset(target, base) != base
    preview = target.rollback(check=True)
    assert preview.check and preview.changed and live_subset(target, base) != base
    done = target.rollback()
    assert done.changed and not done.check
    assert live_subset(target, base) == base
    assert target.rollback().changed is False


@pytest.mark.integration
def test_a_request_after_an_apply_is_served_and_names_its_replica(
    deployed: tuple[BalancerBase, Endpoints], target: TargetBase
) -> None:
    entry, ep = deployed
    target.apply(other_params(target.space(), seed=5))
    target.apply(target.space().baseline())  # a real change back to a set that serves
    body: dict[str, Any] = {
        "model": ep.models[0],
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4,
    }
    resp = requests.post(f"{ep.balancer_url}/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 200, resp.text[:200]
    assert resp.json()["choices"]
    assert ep.replica_header == entry.replica_header
    if entry.replica_header is not None:
        assert resp.headers.get(entry.replica_header) in {r.name for r in ep.replicas}


def test_replica_rows_name_every_replica_and_cluster_status_shows_them(
    deployed: tuple[BalancerBase, Endpoints],
) -> None:
    import json

    from typer.testing import CliRunner

    from lbtune.cli import app

    entry, ep = deployed
    rows = entry.replica_rows(ep)
    assert sorted(r.replica for r in rows) == sorted(r.name for r in ep.replicas)
    assert all(r.status for r in rows)
    assert all(r.active is None or r.active >= 0 for r in rows)
    res = CliRunner().invoke(app, ["cluster", "status", "--state-dir", ep.state_dir, "--json"])
    shown = json.loads(res.stdout)["balancer_replicas"]
    assert sorted(r["replica"] for r in shown) == sorted(r.name for r in ep.replicas)
    text = CliRunner().invoke(app, ["cluster", "status", "--state-dir", ep.state_dir]).stdout
    assert f"{entry.name} status" in text
