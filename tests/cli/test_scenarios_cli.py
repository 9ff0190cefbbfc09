"""`lbtune scenarios list|show|validate`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lbtune.cli.scenarios import app
from lbtune.errors import ConfigError
from lbtune.scenario.loader import BUILTIN_DIR

runner = CliRunner()
BUILTINS = ["agent", "chat", "longctx", "mixed", "prefix", "ramp", "surge"]


def _registered() -> bool:
    from lbtune.cli import app as root

    return any(g.name == "scenarios" for g in root.registered_groups)


def test_list_text_and_json() -> None:
    res = runner.invoke(app, ["list"])
    assert res.exit_code == 0, res.output
    for name in BUILTINS:
        assert name in res.output
    res = runner.invoke(app, ["list", "--json"])
    rows = json.loads(res.output)
    assert [r["name"] for r in rows] == BUILTINS
    ramp = next(r for r in rows if r["name"] == "ramp")
    assert ramp["mode"] == "open" and ramp["duration_s"] == 60
    assert "llama-3.1-70b-instruct-awq" in next(r for r in rows if r["name"] == "mixed")["models"]


def test_show_yaml_and_preview() -> None:
    res = runner.invoke(app, ["show", "longctx"])
    assert res.exit_code == 0, res.output
    doc, _, preview = res.output.partition("\n# preview")
    data = yaml.safe_load(doc)
    assert data["prompt_tokens"]["percentiles"][99.9] == 24576
    assert "spec" in preview and "sampled" in preview


def test_show_json() -> None:
    res = runner.invoke(app, ["show", "surge", "--json"])
    out = json.loads(res.output)
    assert out["scenario"]["load"]["for"] == 15
    p99 = out["preview"]["prompt_tokens"]["p99"]
    assert p99["sampled"] == pytest.approx(p99["spec"], rel=0.3)


def test_validate_ok_and_error(tmp_path: Path) -> None:
    chat = BUILTIN_DIR / "chat.yaml"
    res = runner.invoke(app, ["validate", str(chat)])
    assert res.exit_code == 0 and res.output.startswith(f"ok: {chat}: scenario 'chat'")
    bad = tmp_path / "bad.yaml"
    bad.write_text(chat.read_text().replace("users: 16", "users: -3"))
    res = runner.invoke(app, ["validate", str(bad)])
    assert isinstance(res.exception, ConfigError)
    assert "load.users: must be >= 1 (got -3)" in str(res.exception)


def test_unknown_name() -> None:
    res = runner.invoke(app, ["show", "nope"])
    assert isinstance(res.exception, ConfigError)
    assert "Available: agent, chat, longctx, mixed, prefix, ramp, surge" in str(res.exception)


@pytest.mark.parametrize("cmd", [[], ["list"], ["show"], ["validate"]])
def test_help(cmd: list[str]) -> None:
    res = runner.invoke(app, [*cmd, "--help"])
    assert res.exit_code == 0 and len(res.output) > 50


@pytest.mark.skipif(not _registered(), reason="scenarios sub-app not yet registered in lbtune.cli")
def test_root_cli_exit_2_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nload: {type: rate, rate: -1}\nmodels: {m: 1}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "lbtune", "scenarios", "validate", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith(f"error: {bad}: ")
    assert "load.rate: must be > 0" in lines[0]
