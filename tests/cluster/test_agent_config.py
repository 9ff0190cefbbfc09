"""The cluster YAML's `agent` section, the agent.yaml `up` writes, and weights ownership
(pure: no processes)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lbtune.agent.config import load_agent_config, read_agent_file, write_agent_file
from lbtune.cluster import agent
from lbtune.cluster.config import load_config
from lbtune.cluster.render import render_prometheus
from lbtune.cluster.resolve import resolve
from lbtune.errors import ConfigError
from lbtune.records.statedir import StatePaths
from lbtune.targets.base import RejectedBeforeApply
from lbtune.targets.haproxy.target import HaproxyTarget
from tests.targets.test_haproxy_target import fake_endpoints

M8 = "llama-3.1-8b-instruct"
REPLICAS = f"replicas: [{{gpu: l4-24g, models: [{M8}]}}]\n"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "x.yaml"
    p.write_text(text)
    return p


def test_the_agent_is_off_by_default_and_gets_no_port() -> None:
    cfg, _ = load_config("mini2")
    assert cfg.agent.enabled is False and cfg.agent.settings == {}
    assert resolve(cfg).ports.agent is None


def test_agent_presets_enable_it_with_latency_led_coefficients() -> None:
    for name in ("hetero4-agent", "mini2-agent"):
        cfg, _ = load_config(name)
        assert cfg.agent.enabled and cfg.balancer == "haproxy"
        assert cfg.agent.settings["b"] > cfg.agent.settings["a"]
    assert resolve(load_config("hetero4-agent")[0]).ports.agent == 9492
    ports = resolve(load_config("mini2-agent")[0]).ports  # ports: auto
    assert ports.agent not in (None, 0)
    assert len({ports.balancer, ports.stats, ports.prometheus, ports.exporter, ports.agent}) == 5


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("agent: {enabld: true}\n", "agent.enabld: unknown field; valid fields: enabled, settings"),
        (
            "agent: {enabled: true, settings: {coef_a: 1}}\n",
            "agent.settings: coef_a: unknown agent setting. Known: enabled, interval_s,",
        ),
        (
            "agent: {enabled: true, settings: {state_dir: /x}}\n",
            "agent.settings: state_dir: set by the cluster",
        ),
        (
            "agent: {enabled: true, settings: {metrics_port: 1}}\n",
            "agent.settings: metrics_port: set by the cluster (ports.agent)",
        ),
        (
            "agent: {enabled: true, settings: {a: -1}}\n",
            "agent.settings: a: must be >= 0 (got -1)",
        ),
        (
            "agent: {enabled: true, settings: {min_weight: 200, max_weight: 100}}\n",
            "agent.settings: min_weight (200) must be <= max_weight (100)",
        ),
        ("ports: {agent: 70000}\n", "ports.agent: must be <= 65535 (got 70000)"),
        (
            "balancer: vllm-router\nagent: {enabled: true}\n",
            "'agent.enabled' needs a balancer with live weights",
        ),
    ],
)
def test_agent_errors_name_the_field(tmp_path: Path, body: str, expected: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, "name: x\n" + body + REPLICAS))
    assert "x.yaml: " in str(exc.value)
    assert expected in str(exc.value)


def test_agent_yaml_has_the_clusters_wiring_a_scaled_ceiling_and_the_settings(
    tmp_path: Path,
) -> None:
    paths = StatePaths(tmp_path)
    body = "name: x\ntime_scale: 4\nports: auto\nagent: {enabled: true, settings: {b: 0.6}}\n"
    cluster = resolve(load_config(write(tmp_path, body + REPLICAS))[0])
    agent.write_config(cluster, paths)
    doc = read_agent_file(paths.agent_config)
    assert doc == {
        "prometheus_url": f"http://127.0.0.1:{cluster.ports.prometheus}",
        "state_dir": str(tmp_path),
        "metrics_port": cluster.ports.agent,
        "interval_s": 1.0,
        "ttft_ceiling_s": 0.25,  # AgentConfig's 1 s, in the sim's time (scale 4)
        "b": 0.6,
    }
    cfg = load_agent_config(paths.agent_config)  # what `lbtune agent run --config` reads
    assert cfg.metrics_port == cluster.ports.agent and cfg.b == 0.6 and cfg.a == 0.5
    # settings win over the cluster's defaults
    preset = resolve(load_config("mini2-agent")[0])
    assert agent.settings(preset, paths)["ttft_ceiling_s"] == 0.1
    assert agent.command(paths)[-4:] == ["agent", "run", "--config", str(paths.agent_config)]


def test_write_agent_file_refuses_invalid_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"agent\.yaml: interval_s: must be > 0 \(got 0\)"):
        write_agent_file(tmp_path / "agent.yaml", {"interval_s": 0})
    assert not (tmp_path / "agent.yaml").exists()


def test_prometheus_scrapes_the_agent_only_when_it_runs(tmp_path: Path) -> None:
    with_agent = resolve(load_config("hetero4-agent")[0])
    prom = render_prometheus(with_agent)
    assert "job_name: lbtune-agent" in prom and '"127.0.0.1:9492"' in prom
    assert "job_name: lbtune-agent" not in render_prometheus(resolve(load_config("hetero4")[0]))
    if shutil.which("promtool"):
        (tmp_path / "p.yml").write_text(prom)
        proc = subprocess.run(
            ["promtool", "check", "config", str(tmp_path / "p.yml")],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def _agent_target(tmp_path: Path, enabled: bool = True) -> HaproxyTarget:
    ep = fake_endpoints(tmp_path).model_copy(update={"agent_config": str(tmp_path / "agent.yaml")})
    write_agent_file(tmp_path / "agent.yaml", {"enabled": enabled, "metrics_port": 1})
    return HaproxyTarget(ep)


def test_while_the_agent_runs_the_weights_are_fixed_knobs(tmp_path: Path) -> None:
    target = _agent_target(tmp_path)
    space = target.space()
    assert target.agent_owns_weights()
    assert all(space.params[f"weight.{r}"].fixed for r in ("h100-0", "a100-0", "l4-0"))
    assert not space.params["maxconn.l4-0"].fixed and not space.params["agent.b"].fixed
    free = HaproxyTarget(fake_endpoints(tmp_path)).space()
    assert not free.params["weight.l4-0"].fixed


def test_a_weights_only_parameter_set_is_refused_before_anything_is_touched(
    tmp_path: Path,
) -> None:
    # No HAProxy runs here: the refusal must come before the runtime API is asked.
    target = _agent_target(tmp_path)
    with pytest.raises(RejectedBeforeApply, match=r"weight\.l4-0: the feedback agent owns"):
        target.apply({"weight.l4-0": 5})
    assert target.owned_elsewhere() == {"weight.h100-0", "weight.a100-0", "weight.l4-0"}


def test_an_observe_only_agent_leaves_the_weights_to_lbtune(tmp_path: Path) -> None:
    target = _agent_target(tmp_path, enabled=False)
    assert not target.agent_owns_weights()
    assert not target.space().params["weight.l4-0"].fixed
    assert target.owned_elsewhere() == frozenset()
