"""`--help` as a newcomer reads it: switches take no value, and a log gets wide tables."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from lbtune.cli import PIPED_COLUMNS, app


def _option_line(text: str, option: str) -> str:
    return next(line for line in text.splitlines() if re.search(rf"{option}\b", line))


def test_switches_show_no_value_type_and_options_keep_theirs() -> None:
    runner = CliRunner()
    root = runner.invoke(app, ["--help"], env={"COLUMNS": "120"}).output
    assert "<int>" not in _option_line(root, "--verbose")
    assert "<bool>" not in root
    stress = runner.invoke(app, ["stress", "--help"], env={"COLUMNS": "120"}).output
    assert "<bool>" not in _option_line(stress, "--json")
    assert "<float>" in _option_line(stress, "--duration")
    assert "<int>" in _option_line(stress, "--workers")


def test_optimize_help_says_what_trial_1_is_on_a_round_robin_live_config() -> None:
    out = CliRunner().invoke(app, ["optimize", "--help"], env={"COLUMNS": "200"}).output
    assert "trial 1 is least-conn" in " ".join(out.split())


def test_piped_help_is_wider_than_80_columns() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [sys.executable, "-m", "lbtune", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    widths = {len(line) for line in out.splitlines()}
    assert max(widths) == PIPED_COLUMNS
