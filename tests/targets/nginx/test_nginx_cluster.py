"""nginx in the embedded cluster (``lbtune/data/clusters/mini2-nginx.yaml``): the launch hook, the
Prometheus job, and ``lbtune apply --target nginx`` through Ansible (show, check with a
diff, apply, rollback), as for HAProxy."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lbtune.apply import apply_params
from lbtune.cluster import api
from lbtune.errors import ConfigError
from lbtune.records.endpoints import Endpoints
from lbtune.targets.base import RejectedBeforeApply
from lbtune.targets.nginx.target import NginxTarget
from tests.targets._cluster_fixtures import (
    M8,
    M70,
    apply_cli,
    baseline_target,
    embedded_cluster,
)
from tests.targets.nginx.conftest import chat, needs_nginx

pytestmark = [needs_nginx, pytest.mark.integration]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    yield from embedded_cluster(tmp_path_factory, "mini2-nginx")


@pytest.fixture
def target(cluster: Endpoints) -> NginxTarget:
    """Baseline live, no last known good recorded."""
    return baseline_target(cluster, "nginx", NginxTarget)


def _query(prometheus: str, promql: str) -> list[dict[str, object]]:
    url = f"{prometheus}/api/v1/query?query={urllib.parse.quote(promql)}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        result: list[dict[str, object]] = json.load(resp)["data"]["result"]
        return result


def test_the_cluster_routes_by_model_and_prometheus_scrapes_the_exporter(
    cluster: Endpoints,
) -> None:
    assert cluster.balancer == "nginx" and cluster.balancer_jobs == ["nginx"]
    assert api.status(cluster.state_dir).healthy
    status, headers, _ = chat(cluster.balancer_url, M70)
    assert status == 200 and headers["x-lbtune-replica"] == "h100-0"
    assert chat(cluster.balancer_url, M8)[0] == 200
    up = _query(cluster.prometheus_url, 'up{job="nginx"}')
    assert [r["value"][1] for r in up] == ["1"]  # type: ignore[index]


def test_ansible_check_mode_shows_a_diff_and_changes_nothing(target: NginxTarget) -> None:
    text = target.site.conf.read_text()
    out = apply_params(target, {"weight.l4-0": 7}, via="ansible", check=True, source="t")
    assert out.result.check and out.result.changed
    assert out.result.diff == {"weight.l4-0": (10, 7)}
    assert [h.line() for h in out.hosts] == ["localhost: changed (1 knobs, reloaded)"]
    assert "+weight.l4-0: 7" in out.log_path.read_text()  # type: ignore[union-attr]
    assert target.site.conf.read_text() == text


def test_ansible_apply_then_no_change(target: NginxTarget) -> None:
    params = {"algorithm": "random_two_least_conn", "weight.l4-0": 4}
    out = apply_params(target, params, via="ansible", source="t")
    assert out.result.changed and out.result.reloaded
    assert {k: target.read_live()[k] for k in params} == params
    again = apply_params(target, params, via="ansible", source="t")
    assert not again.result.changed


def test_cli_show_check_apply_invalid_and_rollback(target: NginxTarget, tmp_path: Path) -> None:
    runner, app, sd = CliRunner(), apply_cli(), str(target.state_dir)
    shown = runner.invoke(app, ["apply", "-t", "nginx", "--show", "--state-dir", sd])
    assert shown.exit_code == 0, shown.output
    doc = yaml.safe_load(shown.stdout)
    assert doc["target"] == "nginx" and doc["params"]["algorithm"] == "round_robin"
    doc["params"]["algorithm"] = "least_conn"
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(doc))
    args = ["apply", "-t", "nginx", "-p", str(edited), "--state-dir", sd]
    check = runner.invoke(app, [*args, "--check"])
    assert check.exit_code == 0, check.output
    assert "algorithm: round_robin -> least_conn" in check.stdout
    assert "least_conn;" not in target.site.conf.read_text()
    done = runner.invoke(app, args)
    assert done.exit_code == 0 and "apply: changed" in done.stdout, done.output
    assert target.read_live()["algorithm"] == "least_conn"
    bad = tmp_path / "bad.yaml"
    bad.write_text("weight.h100-0: 500\n")
    text = target.site.conf.read_text()
    refused = runner.invoke(app, ["apply", "-t", "nginx", "-p", str(bad), "--state-dir", sd])
    assert isinstance(refused.exception, ConfigError) and refused.exception.exit_code == 2
    assert "weight.h100-0" in str(refused.exception)
    assert target.site.conf.read_text() == text
    target.apply({"algorithm": "hash"})  # drift outside lbtune's record
    back = runner.invoke(app, ["rollback", "-t", "nginx", "--state-dir", sd])
    assert back.exit_code == 0, back.output
    assert target.read_live()["algorithm"] == "least_conn"


def test_a_config_nginx_rejects_through_ansible_keeps_the_live_one(target: NginxTarget) -> None:
    text, pids = target.site.conf.read_text(), target.worker_pids()
    with pytest.raises(RejectedBeforeApply, match="nginx rejects the new config"):
        apply_params(
            target,
            {"algorithm": "least_conn"},
            via="ansible",
            extravars={"lbtune_options": {"template_overrides": {"keepalive": "bogus"}}},
        )
    assert target.site.conf.read_text() == text and target.worker_pids() == pids
    assert target.read_live()["algorithm"] == "round_robin"
