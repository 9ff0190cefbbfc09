"""Issue 16 #5: a config file that is not UTF-8 is one line naming the file, never a
traceback (cluster, space, params and agent files; scenarios are in test_inputs.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lbtune.agent.config import load_agent_config
from lbtune.cluster.config import load_config
from lbtune.errors import ConfigError
from lbtune.targets.space import ParameterSpace, load_params_file

LATIN1 = "name: caf\xe9\n".encode("latin-1")

LOADERS: dict[str, Callable[[Path], Any]] = {
    "cluster": load_config,
    "space": ParameterSpace.load,
    "params": load_params_file,
    "agent": load_agent_config,
}


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_a_non_utf8_file_is_one_config_error(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"{kind}.yaml"
    path.write_bytes(LATIN1)
    with pytest.raises(ConfigError) as exc:
        LOADERS[kind](path)
    message = str(exc.value)
    assert str(path) in message or path.name in message
    assert "UTF-8" in message and "\n" not in message


def test_the_cli_says_one_line_for_a_non_utf8_cluster_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_bytes(LATIN1)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lbtune",
            "cluster",
            "up",
            "--config",
            str(path),
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "UTF-8" in lines[0]
