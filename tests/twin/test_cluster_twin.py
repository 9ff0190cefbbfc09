"""The cluster as the twin sees it (:mod:`lbtune.cluster.twin`) and the registry hook
(:meth:`BalancerBase.routing_model`): every balancer brings its model, one without gets one
line, the running cluster's recorded config is the twin's."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import yaml

from lbtune.cluster.config import load_config
from lbtune.cluster.twin import (
    AGENT_NOTE,
    BalancerModel,
    running_twin,
    space_path,
    twin_cluster,
    twin_params,
)
from lbtune.errors import ConfigError
from lbtune.targets import balancer, names
from lbtune.targets.space import ParameterSpace
from lbtune.twin.routing import RoutingModel
from tests.targets.test_base import FakeBalancer


@pytest.mark.parametrize("name", names())
def test_every_registered_balancer_brings_its_model(name: str) -> None:
    replicas = twin_cluster("mini2").replicas
    space = ParameterSpace.load(space_path(name), [r.name for r in replicas])
    model = balancer(name).routing_model(space.baseline(), replicas, seed=3)
    assert isinstance(model, RoutingModel)


def test_a_balancer_without_a_model_is_one_line() -> None:
    replicas = twin_cluster("mini2").replicas
    with pytest.raises(ConfigError, match=r"^the twin has no model of fake$"):
        FakeBalancer().routing_model({}, replicas)


def test_the_balancer_model_pickles_as_its_name() -> None:
    factory = BalancerModel("haproxy")
    again = pickle.loads(pickle.dumps(factory))
    assert again == factory
    model = again({"algorithm": "leastconn"}, twin_cluster("mini2").replicas)
    assert type(model).__module__ == "lbtune.targets.haproxy.twin"


def test_the_running_cluster_is_its_recorded_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no cluster config recorded"):
        running_twin(tmp_path)
    cfg = load_config("hetero4")[0].model_copy(update={"time_scale": 6.0, "seed": 5})
    (tmp_path / "config.json").write_text(json.dumps(cfg.model_dump(mode="json")))
    tc = running_twin(tmp_path)
    assert [r.name for r in tc.replicas] == ["h100-0", "h100-1", "a100-0", "l4-0"]
    opts = tc.options()
    assert (opts.time_scale, opts.host_seed) == (6.0, 5)
    assert tc.options(2.0).time_scale == 2.0


def test_external_replicas_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "ext.yaml"
    doc = {
        "name": "ext",
        "external": [{"name": "a", "url": "http://127.0.0.1:9", "models": ["m"]}],
    }
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"; a \(external or real vLLM\) have no fit: run"):
        twin_cluster(f)


def test_overlays_are_validated_in_order_and_the_idle_agent_dropped() -> None:
    tc = twin_cluster("mini2")
    values, notes = twin_params(
        tc, [("a.yaml", {"algorithm": "hash", "hash_bytes": 64}), ("--set", {"hash_bytes": 128})]
    )
    assert values["algorithm"] == "hash" and values["hash_bytes"] == 128
    assert notes == [AGENT_NOTE] and not any(k.startswith("agent.") for k in values)
    with pytest.raises(ConfigError, match=r"^b\.yaml: hash_bytes: 1 is out of range"):
        twin_params(tc, [("b.yaml", {"hash_bytes": 1})])
