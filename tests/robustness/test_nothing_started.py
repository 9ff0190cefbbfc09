"""A bad space or scenario file given to ``optimize`` is refused before the embedded cluster
is brought up, so a typo never leaves a cluster running behind a one-line error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

LBTUNE = [sys.executable, "-m", "lbtune"]


@pytest.mark.parametrize("what", ["space", "scenario"])
def test_a_bad_file_starts_no_cluster(what: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("params: [unclosed\n")
    state = tmp_path / "state"
    cmd = [
        *LBTUNE,
        "optimize",
        "--budget",
        "1",
        "--cluster",
        "mini2",
        "--state-dir",
        str(state),
        "--storage",
        f"sqlite:///{tmp_path / 's.db'}",
        "--out",
        str(tmp_path / "out"),
        f"--{what}",
        str(bad),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        started = (state / "endpoints.json").exists()
    finally:
        down = [*LBTUNE, "cluster", "down", "--state-dir", str(state)]
        subprocess.run(down, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and str(bad) in proc.stderr
    assert not started, "a cluster was brought up for a command refused on its input"
