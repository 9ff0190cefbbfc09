"""HAProxy (the embedded cluster's default) and Prometheus configs: the real tools accept them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lbtune.cluster.api import launch_spec
from lbtune.cluster.config import load_config
from lbtune.cluster.render import render_prometheus, sim_spec
from lbtune.cluster.resolve import resolve
from lbtune.records.statedir import StatePaths
from lbtune.targets import balancer
from lbtune.targets.base import pool_names
from lbtune.targets.haproxy.config import render_untuned
from lbtune.targets.haproxy.files import HaproxyFiles, Site, config_alerts

needs_haproxy = pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy missing")


@pytest.fixture
def hetero4(tmp_path: Path) -> tuple[str, str, StatePaths]:
    cluster = resolve(load_config("hetero4")[0])
    paths = StatePaths(tmp_path)
    paths.create()
    entry = balancer("haproxy")
    spec = launch_spec(cluster, paths, entry)
    haproxy = render_untuned(Site.from_spec(spec))
    return haproxy, render_prometheus(cluster, entry.scrape_jobs(spec)), paths


def test_haproxy_config_has_the_untuned_defaults_and_the_required_options(
    hetero4: tuple[str, str, StatePaths],
) -> None:
    cfg, _, paths = hetero4
    for needle in (
        "master-worker",
        f"stats socket {paths.root}/haproxy.sock mode 600 level admin expose-fd listeners",
        f"server-state-file {paths.root}/haproxy.state",
        "load-server-state-from-file global",
        "option http-no-delay",
        "option http-buffer-request",
        "http-check send meth GET uri /health",
        "http-response set-header X-Lbtune-Replica %s",
        "http-request use-service prometheus-exporter if { path /metrics }",
        "timeout server 10m",
        "timeout client 10m",
        "balance roundrobin",
        "bind 127.0.0.1:8000",
        "bind 127.0.0.1:8404",
    ):
        assert needle in cfg, needle
    # Model affinity: the 70B backend holds only the H100s.
    be70 = cfg.split("\nbackend model_llama-3.1-70b-instruct-awq")[1].split("\nbackend ")[0]
    assert "server h100-0 " in be70 and "server h100-1 " in be70
    assert "a100-0" not in be70 and "l4-0" not in be70
    assert cfg.count("weight 100") == 4 + 2 + 4


@needs_haproxy
def test_haproxy_accepts_the_rendered_config(hetero4: tuple[str, str, StatePaths]) -> None:
    cfg, _, paths = hetero4
    files = HaproxyFiles.in_dir(paths.root)
    files.cfg.write_text(cfg)
    assert config_alerts(files.cfg) is None


@needs_haproxy
def test_a_rejected_config_comes_back_with_haproxys_words(tmp_path: Path) -> None:
    bad = tmp_path / "bad.cfg"
    bad.write_text("defaults\n    mode http\n    balance nonsense\n")
    alerts = config_alerts(bad)
    assert alerts is not None and any("balance only supports" in a for a in alerts)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing")
def test_promtool_accepts_the_prometheus_config(hetero4: tuple[str, str, StatePaths]) -> None:
    _, prom, paths = hetero4
    paths.prometheus_yml.write_text(prom)
    proc = subprocess.run(
        ["promtool", "check", "config", str(paths.prometheus_yml)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "scrape_interval: 1s" in prom
    assert 'replica: "h100-1"' in prom and 'gpu: "a100-80g"' in prom
    assert '"127.0.0.1:9491"' in prom  # lbtune's exporter
    assert "job_name: haproxy" in prom and '"127.0.0.1:8404"' in prom  # HAProxy's exporter


def test_backend_names_are_safe_and_unique() -> None:
    names = pool_names(["org/m:1", "org_m_1", "all"])
    assert names == {"org/m:1": "model_org_m_1", "org_m_1": "model_org_m_1_2", "all": "model_all"}


def test_sim_spec_lists_every_simulated_replica(tmp_path: Path) -> None:
    cfg = load_config("hetero4")[0]
    spec = sim_spec(resolve(cfg), StatePaths(tmp_path))
    assert [(r.name, r.gpu, r.port) for r in spec.replicas][-1] == ("l4-0", "l4-24g", 8103)
    assert spec.time_scale == cfg.time_scale and spec.host == "127.0.0.1"
    assert spec.ground_truth_path == str(tmp_path / "ground_truth.jsonl")
