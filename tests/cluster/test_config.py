"""The cluster YAML: presets validate, errors name the file and the field path."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.cluster.config import available_presets, load_config
from lbtune.cluster.resolve import resolve
from lbtune.errors import ConfigError

M8 = "llama-3.1-8b-instruct"
M70 = "llama-3.1-70b-instruct-awq"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "x.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("name", available_presets())
def test_every_preset_validates(name: str) -> None:
    cfg, path = load_config(name)
    assert path.stem == cfg.name == name
    assert resolve(cfg).replicas


def test_hetero4_is_the_default_and_the_70b_sits_only_on_h100s() -> None:
    cfg, _ = load_config(None)
    cluster = resolve(cfg)
    assert cfg.name == "hetero4"
    assert [r.name for r in cluster.replicas] == ["h100-0", "h100-1", "a100-0", "l4-0"]
    assert [r.name for r in cluster.serving(M70)] == ["h100-0", "h100-1"]
    assert len(cluster.serving(M8)) == 4
    assert [r.port for r in cluster.replicas] == [8100, 8101, 8102, 8103]
    assert cluster.ports.balancer == 8000


def test_unknown_gpu_names_file_field_and_choices(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"name: x\nreplicas:\n  - {{gpu: h100-80g, models: [{M8}]}}\n"
        f"  - {{gpu: a100-80g, models: [{M8}]}}\n  - {{gpu: h200, models: [{M8}]}}\n",
    )
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    msg = str(exc.value)
    assert "x.yaml: replicas[2].gpu: Unknown GPU profile 'h200'. Available:" in msg
    assert "h100-80g" in msg


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "name: x\nreplicas: [{gpu: l4-24g, models: [nope]}]\n",
            "replicas[0].models: Unknown model",
        ),
        (
            f"name: x\nreplicas: [{{gpu: l4-24g, models: [{M8}], cnt: 2}}]\n",
            "replicas[0].cnt: unknown field; valid fields: gpu, count, models, name",
        ),
        (f"name: x\nreplicas: [{{gpu: l4-24g, models: [{M70}]}}]\n", "replicas[0]: Models"),
        (
            f"name: x\nports: {{balancr: 1}}\nreplicas: [{{gpu: l4-24g, models: [{M8}]}}]\n",
            "ports.balancr: unknown field; valid fields: balancer, stats",
        ),
        (
            f"name: x\nports: free\nreplicas: [{{gpu: l4-24g, models: [{M8}]}}]\n",
            "ports: Expected 'auto'",
        ),
        ("name: x\n", "Give one of 'replicas'"),
        (f"replicas: [{{gpu: l4-24g, models: [{M8}]}}]\n", "name: required field is missing"),
        (
            "name: x\nexternal: [{name: a, url: 'https://h:1', models: [m]}]\n",
            "external[0].url: Expected http://HOST:PORT",
        ),
        (
            "name: x\nexternal: [{name: a, url: 'http://h:1', models: [m]},"
            " {name: a, url: 'http://h:2', models: [m]}]\n",
            "Duplicate replica names: a",
        ),
        (
            "name: x\nbalancer: nginy\n",
            "balancer: Unknown balancer 'nginy'. Available: haproxy, vllm-router",
        ),
        ("name: [x\n", "invalid YAML"),
        ("- a\n", "expected a mapping"),
    ],
)
def test_errors_name_the_field(tmp_path: Path, body: str, expected: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, body))
    msg = str(exc.value)
    assert msg.endswith(("x.yaml", "")) and "x.yaml: " in msg
    assert expected in msg


def test_unknown_preset_lists_the_presets() -> None:
    with pytest.raises(
        ConfigError, match=r"Unknown cluster preset 'hetero5'\. Available: .*hetero4"
    ):
        load_config("hetero5")


def test_auto_ports_are_distinct_and_groups_are_named_by_gpu_family(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"name: x\nports: auto\nreplicas:\n  - {{gpu: h100-80g, count: 2, models: [{M8}]}}\n"
        f"  - {{gpu: h100-80g, models: [{M8}]}}\n  - {{gpu: l4-24g, name: edge, models: [{M8}]}}\n",
    )
    cluster = resolve(load_config(path)[0])
    assert [r.name for r in cluster.replicas] == ["h100-0", "h100-1", "h100-2", "edge-0"]
    p = cluster.ports
    ports = [p.balancer, p.stats, p.prometheus, p.exporter, *(r.port for r in cluster.replicas)]
    assert len(set(ports)) == len(ports) and 0 not in ports


def test_external_replicas_keep_their_urls(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "name: byo\nallow_remote: true\n"
        "external:\n  - {name: gpu-a, url: 'http://10.0.0.5:8000/', models: [m1, m2]}\n",
    )
    cluster = resolve(load_config(path)[0])
    (r,) = cluster.replicas
    assert (r.url, r.external, r.models, cluster.simulated) == (
        "http://10.0.0.5:8000",
        True,
        ("m1", "m2"),
        (),
    )


def test_a_port_given_twice_is_an_error(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "name: x\nports: {balancer: 9000, stats: 9000}\n"
        f"replicas: [{{gpu: l4-24g, models: [{M8}]}}]\n",
    )
    with pytest.raises(ConfigError, match="port 9000 is used twice"):
        resolve(load_config(path)[0])
