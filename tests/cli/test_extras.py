"""Optional dependencies are extras: without them the command says which one, in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from lbtune.errors import ConfigError
from lbtune.scenario import build_workload, load_scenario

# Run the console entry point with the optional package made unimportable (a None entry in
# sys.modules makes `import x` raise ImportError), whether or not it is installed here.
_WITHOUT = (
    "import sys; sys.modules[{mod!r}] = None; sys.argv = ['lbtune', *sys.argv[1:]]; "
    "from lbtune.cli import main; main()"
)


def _lbtune_without(mod: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT.format(mod=mod), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )


def test_dashboard_without_optuna_dashboard_is_one_line_exit_2() -> None:
    proc = _lbtune_without("optuna_dashboard", "dashboard")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: lbtune dashboard needs optuna-dashboard: pip install 'lbtune[dashboard]' "
        "(or pip install optuna-dashboard)"
    ]
    assert proc.stdout == ""


def test_tokenizer_without_tokenizers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # The error is raised when the workload is built (stress would start a cluster first).
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ConfigError, match=re.escape("lbtune[tokenizer]")):
        build_workload(load_scenario("chat"), tokenizer_path="tok.json")
