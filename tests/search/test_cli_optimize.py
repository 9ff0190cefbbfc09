"""`lbtune optimize` parsing and errors, through a scratch Typer app (the lead wires it)."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from lbtune.cli.optimize import dashboard_command, optimize_command
from lbtune.errors import ConfigError

app = typer.Typer()
app.command("optimize")(optimize_command)
app.command("dashboard")(dashboard_command)


def test_help_lists_every_documented_option() -> None:
    out = CliRunner().invoke(app, ["optimize", "--help"], env={"COLUMNS": "200"}).output
    for opt in (
        "--budget",
        "--scenario",
        "--target",
        "--space",
        "--objective",
        "--sampler",
        "--trial-duration",
        "--study",
        "--storage",
        "--resume",
        "--no-apply",
        "--confirm-runs",
        "--seed",
        "--state-dir",
        "--json",
        "--slo",
        "--weights",
    ):
        assert opt in out, opt
    assert "dashboard" in CliRunner().invoke(app, ["--help"]).output


def test_unknown_objective_is_a_config_error_before_anything_runs(tmp_path: object) -> None:
    res = CliRunner().invoke(app, ["optimize", "--objective", "fastest", "--budget", "1"])
    assert isinstance(res.exception, ConfigError)
    assert "Available: composite, pareto, capacity" in str(res.exception)


def test_bad_weights_name_the_valid_keys() -> None:
    res = CliRunner().invoke(app, ["optimize", "--weights", "p99=1"])
    assert isinstance(res.exception, ConfigError)
    assert "e2e, ttft, decay" in str(res.exception)


def test_capacity_flags_only_with_the_capacity_objective() -> None:
    out = CliRunner().invoke(app, ["optimize", "--help"], env={"COLUMNS": "200"}).output
    assert "--attainment" in out and "--rate" in out and "capacity" in out
    for args, says in (
        (["--rate", "5"], "--rate: only with --objective capacity"),
        (["--attainment", "0.9"], "--attainment: only with --objective capacity"),
        (["--objective", "capacity", "--rate", "0"], "--rate: must be > 0"),
        (["--objective", "capacity", "--attainment", "1.5"], "--attainment '1.5'"),
    ):
        res = CliRunner().invoke(app, ["optimize", *args, "--budget", "1"])
        assert isinstance(res.exception, ConfigError), args
        assert says in str(res.exception), (args, str(res.exception))
