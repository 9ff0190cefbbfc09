"""`lbtune twin run`: figures without a balancer, what-ifs, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lbtune.cli import app
from lbtune.cli.twin import overlays
from lbtune.cluster.twin import twin_cluster, twin_params
from lbtune.errors import ConfigError


def _run(*args: str) -> dict[str, object]:
    res = CliRunner().invoke(app, ["twin", "run", *args, "--json"])
    assert res.exit_code == 0, res.output
    out: dict[str, object] = json.loads(res.stdout)
    return out


def test_twin_run_prints_the_summary_and_the_score_as_json() -> None:
    out = _run("-c", "mini2", "-s", "chat", "-d", "15", "--set", "algorithm=leastconn")
    twin = out["twin"]
    assert isinstance(twin, dict)
    assert twin["replicas"] == ["h100-0", "l4-0"] and twin["time_scale"] == 4.0
    assert twin["params"]["algorithm"] == "leastconn"
    assert twin["unmodeled"] == []
    summary = out["summary"]
    assert isinstance(summary, dict) and summary["scenario"] == "chat"
    assert isinstance(out["score"], float) and out["score"] > 0
    figures = out["figures"]
    assert isinstance(figures, dict) and figures["samples"] > 0


def test_replicas_what_if() -> None:
    assert [r.name for r in twin_cluster("hetero4", "+1").replicas] == [
        "h100-0",
        "h100-1",
        "h100-2",
        "a100-0",
        "l4-0",
    ]
    assert [r.name for r in twin_cluster("hetero4", "l4-1").replicas] == [
        "h100-0",
        "h100-1",
        "a100-0",
    ]
    assert len(twin_cluster("hetero4", "mini2").replicas) == 2
    with pytest.raises(ConfigError, match="no replica group 'x'"):
        twin_cluster("hetero4", "x+1")


def test_params_layering_and_the_inactive_agent(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"params": {"algorithm": "hash", "hash_bytes": 64}}))
    tc = twin_cluster("mini2")
    values, notes = twin_params(tc, overlays("haproxy", f, ["hash_bytes=128", "weight.l4-0=7"]))
    assert values["algorithm"] == "hash" and values["hash_bytes"] == 128
    assert values["weight.l4-0"] == 7 and values["weight.h100-0"] == 100
    assert not any(k.startswith("agent.") for k in values)
    assert notes == ["agent.* knobs have no effect: this cluster runs no feedback agent"]
    with pytest.raises(ConfigError, match=r"--set: hash_bytes: 1 is out of range"):
        twin_params(tc, overlays("haproxy", None, ["hash_bytes=1"]))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-c", "mini2", "--set", "algorithm=bogus"], "--set: algorithm: got 'bogus'"),
        (["-c", "vllm-cpu"], "vllm-0, vllm-1 (external or real vLLM) have no fit"),
        (["-c", "hetero4", "--replicas", "h100-5"], "--replicas h100-5: group h100 has 2"),
        (["-c", "mini2", "-s", "nope"], "Unknown scenario 'nope'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    _one_line_exit_2(["run", *args], message)


def _one_line_exit_2(args: list[str], message: str) -> None:
    """``lbtune twin ARGS`` exits 2 with one line on stderr that holds ``message``."""
    p = subprocess.run(
        [sys.executable, "-m", "lbtune", "twin", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], p.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "-c", "mini2", "--twin-profile", "/nonexistent.json"], "no such file"),
        (["fit", "--fail-on-drift", "10%"], "--fail-on-drift needs --baseline"),
        (["fit", "--baseline", "/nonexistent.json"], "--baseline /nonexistent.json: no such file"),
        (["fit", "--state-dir", "{tmp}"], "twin fit: no cluster running"),
        (["fit", "--state-dir", "{tmp}", "--batch", "1"], "--batch: at least 2"),
    ],
)
def test_fit_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path
) -> None:
    """Before any load: no cluster, a missing profile, a gate without a baseline."""
    _one_line_exit_2([a.replace("{tmp}", str(tmp_path)) for a in args], message)
