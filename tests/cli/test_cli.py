"""The CLI edge: fast, side-effect-free import; --help everywhere; --version."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import typer.main
from typer.testing import CliRunner

from lbtune import __version__
from lbtune.cli import app

HEAVY = ("locust", "gevent", "optuna", "pandas", "ansible_runner", "matplotlib", "pyarrow")


def test_importing_cli_pulls_in_no_heavy_or_patching_module() -> None:
    code = f"import sys, lbtune.cli; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "", f"importing lbtune.cli imported: {out}"


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"lbtune {__version__}"


def _all_commands(group: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path under a click group (typer may vendor its own click)."""
    found: list[tuple[str, ...]] = []
    for name, cmd in group.commands.items():
        path = (*prefix, name)
        found.append(path)
        if hasattr(cmd, "commands"):
            found.extend(_all_commands(cmd, path))
    return found


def test_every_command_has_help_text() -> None:
    root: Any = typer.main.get_command(app)
    commands = _all_commands(root)
    assert {("cluster",), ("cluster", "up"), ("scenarios",)} <= set(commands)
    runner = CliRunner()
    for path in commands:
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        cmd = root
        for part in path:
            cmd = cmd.commands[part]
        assert (cmd.help or "").strip(), f"`lbtune {' '.join(path)}` has no help text"


def test_user_error_is_one_line_without_traceback() -> None:
    """An LbtuneError raised in a command becomes `error: ...` on stderr and exit 2."""
    code = (
        "import sys, typer\n"
        "from lbtune.cli import app, main\n"
        "from lbtune.errors import ConfigError\n"
        "@app.command('boom', hidden=True)\n"
        "def boom() -> None:\n"
        "    raise ConfigError('x.yaml: load.rate: must be > 0')\n"
        "sys.argv = ['lbtune', 'boom']\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: x.yaml: load.rate: must be > 0"
    assert "Traceback" not in proc.stderr
