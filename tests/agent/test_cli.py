"""`lbtune agent run`: help, errors a user can act on, flags over the config file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from lbtune.cli.agent import app
from lbtune.errors import ConfigError, TargetError


def cli() -> typer.Typer:
    """The agent sub-app mounted as the root CLI mounts it (``lbtune agent ...``)."""
    root = typer.Typer()

    @root.callback()
    def _root() -> None:
        pass

    root.add_typer(app, name="agent")
    return root


def test_help() -> None:
    for args in (["agent", "--help"], ["agent", "run", "--help"]):
        result = CliRunner().invoke(cli(), args)
        assert result.exit_code == 0, result.output
    assert "--once" in result.output and "SIGHUP" in result.output
    assert "--dry-run" in result.output and "--prometheus" in result.output


def test_json_needs_once() -> None:
    result = CliRunner().invoke(cli(), ["agent", "run", "--json"])
    assert result.exit_code == 2 and "--json goes with --once" in result.output


def test_no_cluster_to_steer_is_a_target_error(tmp_path: Path) -> None:
    args = ["agent", "run", "--once", "--state-dir", str(tmp_path)]
    args += ["--prometheus", "http://127.0.0.1:9"]
    result = CliRunner().invoke(cli(), args)
    assert isinstance(result.exception, TargetError)
    assert f"No running cluster in {tmp_path}" in str(result.exception)


def test_an_unknown_config_field_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("interval_s: 1\nmax_stpe: 3\n")
    result = CliRunner().invoke(cli(), ["agent", "run", "--once", "--config", str(path)])
    assert isinstance(result.exception, ConfigError)
    assert f"{path}: max_stpe: unknown field" in str(result.exception)


def test_importing_the_cli_module_stays_light() -> None:
    code = (
        "import sys, lbtune.cli.agent; "
        "heavy = [m for m in ('lbtune.agent.loop', 'prometheus_api_client', 'pandas') "
        "if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("recover_kv_threshold: 0.97\n", "must be below drain_kv_threshold"),
        ("min_weight: 50\nmax_weight: 10\n", r"min_weight \(50\) must be <= max_weight \(10\)"),
        ("- 1\n", "expected a mapping"),
        ("a: [\n", "invalid YAML"),
    ],
)
def test_invalid_config_files(tmp_path: Path, text: str, message: str) -> None:
    from lbtune.agent.config import load_agent_config

    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_agent_config(path)


def test_precedence_defaults_file_flags(tmp_path: Path) -> None:
    from lbtune.agent.config import load_agent_config

    path = tmp_path / "agent.json"
    path.write_text('{"agent": {"interval_s": 5, "prometheus_url": "http://127.0.0.2:1"}}')
    cfg = load_agent_config(
        path,
        overrides={"interval_s": 0.5, "state_dir": None},
        defaults={"prometheus_url": "http://127.0.0.3:1", "state_dir": "/cluster"},
    )
    assert (cfg.interval_s, cfg.prometheus_url, cfg.state_dir) == (
        0.5,
        "http://127.0.0.2:1",
        "/cluster",
    )
    assert (cfg.a, cfg.b, cfg.c, cfg.z_threshold) == (0.5, 0.3, 0.2, 3.5)
