"""`--help` as a newcomer reads it: switches take no value, and a log gets wide tables."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.models import OptionInfo
from typer.testing import CliRunner

from lbtune.cli import PIPED_COLUMNS, app, options


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


def _commands() -> dict[str, Any]:
    """Every command of the app by its path (``stress``, ``agent run``, ...); duck-typed:
    typer may vendor its own click."""
    out: dict[str, Any] = {}

    def walk(cmd: Any, path: str) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}".strip())
        else:
            out[path] = cmd

    walk(typer.main.get_command(app), "")
    return out


def _shared() -> dict[str, tuple[OptionInfo, list[str]]]:
    """The options of lbtune.cli.options, by their flag, with all their flags."""
    out = {}
    for name in options.__all__:
        alias = getattr(options, name)
        for info in getattr(alias, "__metadata__", ()):
            if isinstance(info, OptionInfo):  # Annotated: the first flag is its `default`
                flags = [str(info.default), *(info.param_decls or ())]
                out[flags[0]] = (info, flags)
    return out


def test_a_shared_option_is_the_same_in_every_command_that_takes_it() -> None:
    """Declared once (lbtune.cli.options): flag, short form and help cannot drift apart.
    Options of the same name but another meaning are the listed exceptions."""
    other_meaning = {
        ("--target", "stress"),  # a balancer URL, not a target name
        ("--seed", "compare"),  # the bootstrap's seed
        ("--json", "cluster up"),
        ("--json", "cluster status"),
        ("--state-dir", "cluster up"),
        ("--state-dir", "cluster down"),
        ("--state-dir", "cluster status"),
        ("--storage", "history"),  # a path or URL, default from the environment
        ("--scenario", "history"),  # a filter
        ("--out", "scenarios fit"),  # a scenario file
    }
    shared = _shared()
    assert {"--scenario", "--json", "--ci", "--junit", "--state-dir", "--seed"} <= set(shared)
    users: dict[str, list[str]] = {}
    for path, cmd in _commands().items():
        for p in cmd.params:
            flag = next((o for o in p.opts if o in shared), None)
            if flag is None or (flag, path) in other_meaning:
                continue
            info, flags = shared[flag]
            assert p.help == info.help, f"{path} {flag}: not the shared option"
            assert sorted(p.opts) == sorted(flags), f"{path} {flag}"
            users.setdefault(flag, []).append(path)
    assert {"stress", "optimize"} <= set(users["--scenario"]) & set(users["--trace"])
    assert {"stress", "optimize", "compare"} <= set(users["--ci"]) & set(users["--junit"])
    assert len(users["--json"]) >= 5 and len(users["--state-dir"]) >= 5
    assert all(len(paths) > 1 for paths in users.values()), users  # shared means shared


@pytest.mark.parametrize("command", ["stress", "optimize"])
@pytest.mark.parametrize("flag", [["--speedup", "2"], ["--trace-format", "azure"]])
def test_trace_options_need_a_trace(command: str, flag: list[str]) -> None:
    out = CliRunner().invoke(app, [command, *flag], env={"COLUMNS": "200"})
    assert out.exit_code == 2
    assert "--trace-format and --speedup apply to --trace" in out.output
