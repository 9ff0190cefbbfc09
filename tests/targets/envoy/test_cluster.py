"""The embedded cluster with ``balancer: envoy`` (mini2-envoy): launch, health, Prometheus
scraping Envoy, ``lbtune apply --target envoy`` (show, check with diff, apply through
Ansible, bad input, rollback) and the feedback agent's live-weights interface."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.request import urlopen

import pytest
import yaml
from typer.testing import CliRunner

from lbtune.apply import apply_params
from lbtune.cluster import api
from lbtune.errors import ConfigError
from lbtune.records.endpoints import Endpoints
from lbtune.targets import balancer
from lbtune.targets.envoy.admin import EnvoyAdmin
from lbtune.targets.envoy.target import EnvoyTarget
from lbtune.targets.lkg import LkgStore
from tests.targets._cluster_fixtures import M8, apply_cli, baseline_target, embedded_cluster
from tests.targets.envoy.conftest import chat, envoy_missing

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    missing = "envoy" if envoy_missing() else None
    yield from embedded_cluster(tmp_path_factory, "mini2-envoy", missing=missing)


@pytest.fixture
def fresh(cluster: Endpoints) -> EnvoyTarget:
    return baseline_target(cluster, "envoy", EnvoyTarget)


def l4_weight(target: EnvoyTarget) -> int:
    return target.weights()["l4-0"]


def test_the_cluster_is_healthy_and_prometheus_scrapes_envoy(cluster: Endpoints) -> None:
    assert cluster.balancer == "envoy"
    assert api.status(cluster.state_dir).problems == []
    resp = chat(cluster.balancer_url, M8)
    assert resp.status_code == 200 and resp.headers["X-Lbtune-Replica"] in {"h100-0", "l4-0"}
    query = cluster.prometheus_url + "/api/v1/query?query=envoy_cluster_membership_healthy"
    deadline = time.monotonic() + 20
    series: list[dict[str, object]] = []
    while time.monotonic() < deadline and not series:
        with urlopen(query, timeout=5) as r:
            series = json.load(r)["data"]["result"]
        time.sleep(0.2)
    assert {s["metric"]["job"] for s in series} == {"envoy"}  # type: ignore[index]


def test_cli_show_check_apply_bad_input_and_rollback(fresh: EnvoyTarget, tmp_path: Path) -> None:
    runner, app, sd = CliRunner(), apply_cli(), str(fresh.state_dir)
    shown = runner.invoke(app, ["apply", "--show", "-t", "envoy", "--state-dir", sd])
    assert shown.exit_code == 0, shown.output
    doc = yaml.safe_load(shown.stdout)
    assert doc["target"] == "envoy" and doc["params"]["lb_policy"] == "ROUND_ROBIN"
    doc["params"]["weight.l4-0"] = 44
    doc["params"]["lb_policy"] = "LEAST_REQUEST"
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(doc))
    args = ["apply", "-t", "envoy", "-p", str(edited), "--state-dir", sd]
    check = runner.invoke(app, [*args, "--check"])
    assert check.exit_code == 0, check.output
    assert "weight.l4-0: 100 -> 44" in check.stdout and "nothing was touched" in check.stdout
    assert l4_weight(fresh) == 100 and fresh.read_live()["lb_policy"] == "ROUND_ROBIN"
    done = runner.invoke(app, args)  # through Ansible (lbtune/data/playbooks/envoy-apply.yml)
    assert done.exit_code == 0, done.output
    assert "apply: changed, reloaded" in done.stdout
    assert l4_weight(fresh) == 44 and fresh.read_live()["lb_policy"] == "LEAST_REQUEST"
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_pending_requests: 9\n")
    refused = runner.invoke(app, ["apply", "-t", "envoy", "-p", str(bad), "--state-dir", sd])
    assert isinstance(refused.exception, ConfigError) and refused.exception.exit_code == 2
    assert "\n" not in str(refused.exception) and "max_pending_requests" in str(refused.exception)
    assert l4_weight(fresh) == 44
    fresh.apply({"weight.l4-0": 3, "lb_policy": "RANDOM"})  # drift outside lbtune's record
    back = runner.invoke(app, ["rollback", "-t", "envoy", "--state-dir", sd, "--json"])
    assert back.exit_code == 0, back.output
    assert l4_weight(fresh) == 44 and fresh.read_live()["lb_policy"] == "LEAST_REQUEST"


def test_ansible_check_mode_shows_a_diff_and_changes_nothing(fresh: EnvoyTarget) -> None:
    out = apply_params(fresh, {"weight.l4-0": 11}, via="ansible", check=True, source="t")
    assert out.result.check and out.result.changed and not out.result.reloaded
    assert out.result.diff == {"weight.l4-0": (100, 11)}
    assert "+weight.l4-0: 11" in out.log_path.read_text()  # type: ignore[union-attr]
    assert l4_weight(fresh) == 100
    assert LkgStore(fresh.state_dir, "envoy").get() is None


def test_live_weights_for_the_agent(cluster: Endpoints, fresh: EnvoyTarget) -> None:
    entry = balancer("envoy")
    assert entry.live_weights
    weights = entry.weights(cluster)
    admin = EnvoyAdmin(fresh.layout.admin_url)
    before = admin.epoch_uptime()
    weights.set_weights({"l4-0": 7})
    assert weights.weights() == {"h100-0": 100, "l4-0": 7}
    assert fresh.read_live()["weight.l4-0"] == 7
    assert admin.epoch_uptime()[0] == before[0]  # no restart
