"""`lbtune cluster ...`: help text, exit codes, JSON output when nothing runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lbtune.cli import app

runner = CliRunner()


@pytest.mark.parametrize("command", ["up", "down", "status", "calibrate"])
def test_every_command_has_help(command: str) -> None:
    result = runner.invoke(app, ["cluster", command, "--help"])
    assert result.exit_code == 0
    assert "--state-dir" in result.output


def test_status_json_when_nothing_runs(tmp_path: Path) -> None:
    result = runner.invoke(app, ["cluster", "status", "--json", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["running"] is False and data["endpoints"] is None


def test_down_when_nothing_runs(tmp_path: Path) -> None:
    result = runner.invoke(app, ["cluster", "down", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0
    assert "nothing was running" in result.stdout


def test_calibrate_when_nothing_runs_is_one_line(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "lbtune", "cluster", "calibrate", "--state-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip() == (
        f"error: no cluster is running in {tmp_path}; run `lbtune cluster up`"
    )


def test_a_config_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lbtune",
            "cluster",
            "up",
            "-c",
            "hetero5",
            "--state-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert proc.stderr.startswith("error: Unknown cluster preset 'hetero5'. Available:")


def test_importing_the_cli_imports_no_cluster_library() -> None:
    code = (
        "import sys, lbtune.cli; print([m for m in sys.modules if m.startswith('lbtune.cluster')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]"
