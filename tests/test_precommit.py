"""`.pre-commit-config.yaml` is valid and runs exactly the lint block of scripts/test.sh.

CI runs scripts/test.sh; a developer's commit hook runs pre-commit. Both are parsed here
(the shell lines between ``if [ "${LBTUNE_SKIP_LINT:-0}" != 1 ]; then`` and ``fi``; each
hook's ``entry`` + ``args``), so a check added to, or changed in, one of them and not the
other fails this test.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".pre-commit-config.yaml"
TEST_SH = ROOT / "scripts" / "test.sh"
LINT_START = 'if [ "${LBTUNE_SKIP_LINT:-0}" != 1 ]; then'


def lint_block(script: str) -> list[list[str]]:
    """The commands of the lint block of scripts/test.sh, one argv each."""
    lines = [line.strip() for line in script.splitlines()]
    assert LINT_START in lines, f"scripts/test.sh has no lint block ({LINT_START!r})"
    body = lines[lines.index(LINT_START) + 1 :]
    assert "fi" in body, "scripts/test.sh: the lint block has no closing fi"
    cmds = [shlex.split(line, comments=True) for line in body[: body.index("fi")]]
    return [c for c in cmds if c]


def hook_commands(config: dict[str, Any]) -> list[list[str]]:
    """Each local hook's command line (``entry`` + ``args``), in order."""
    cmds = []
    for repo in config["repos"]:
        assert repo["repo"] == "local", "hooks must be local (offline: the project's .venv)"
        for hook in repo["hooks"]:
            assert hook["language"] == "system" and hook.get("pass_filenames") is False, hook
            cmds.append([*shlex.split(hook["entry"]), *hook.get("args", [])])
    return cmds


def _config() -> dict[str, Any]:
    doc = yaml.safe_load(CONFIG.read_text())
    assert isinstance(doc, dict)
    return doc


def test_precommit_config_is_valid() -> None:
    binary = Path(sys.executable).with_name("pre-commit")
    assert binary.exists(), "pre-commit missing: pip install -e '.[dev]'"
    cmd = [str(binary), "validate-config", str(CONFIG)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_precommit_runs_the_same_checks_as_ci() -> None:
    ci = lint_block(TEST_SH.read_text())
    assert [c[0] for c in ci] == [
        ".venv/bin/ruff",
        ".venv/bin/ruff",
        ".venv/bin/mypy",
        ".venv/bin/lint-imports",
    ]
    assert hook_commands(_config()) == ci


def test_a_drifted_copy_is_caught() -> None:
    ci = lint_block(TEST_SH.read_text())
    drifted = _config()
    drifted["repos"][0]["hooks"][0]["entry"] = ".venv/bin/ruff check lbtune"
    assert hook_commands(drifted) != ci
    extra = TEST_SH.read_text().replace(LINT_START, LINT_START + "\n  .venv/bin/extra-check", 1)
    assert lint_block(extra) != hook_commands(_config())
    with pytest.raises(AssertionError, match="no lint block"):
        lint_block("#!/bin/sh\nexec pytest\n")
