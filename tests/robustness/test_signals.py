"""Defect 3 of issue 16: SIGTERM ends a stress like Ctrl-C, and no load generator outlives
the process that started it, whatever kills that process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.robustness.conftest import LBTUNE, processes_mentioning

pytestmark = pytest.mark.integration

SCENARIO = """\
name: tiny
duration_s: 60
load: {type: constant, users: 4}
models: {echo: 1}
prompt_tokens: {type: fixed, value: 8}
output_tokens: {type: fixed, value: 4}
"""


def _start(tmp_path: Path, echo_url: str) -> tuple[subprocess.Popen[str], Path]:
    scen = tmp_path / "tiny.yaml"
    scen.write_text(SCENARIO)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            *LBTUNE,
            "stress",
            "--scenario",
            str(scen),
            "--target",
            echo_url,
            "--out",
            str(out),
            "--ci",
            "--duration",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Ready once the generator has written records (load is flowing).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if any(p.stat().st_size > 0 for p in out.glob("records-*.jsonl")):
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    assert processes_mentioning(str(out)), "the load generator must be running"
    return proc, out


def _gone(marker: str, within_s: float = 30) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = processes_mentioning(marker)
        if not left:
            return []
        time.sleep(0.2)
    return processes_mentioning(marker)


@pytest.mark.parametrize(
    ("sig", "rc"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"]
)
def test_a_signal_writes_the_partial_report(
    tmp_path: Path, echo_url: str, sig: signal.Signals, rc: int
) -> None:
    proc, out = _start(tmp_path, echo_url)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == rc, err
    assert "Traceback" not in err
    assert (out / "summary.json").is_file(), err
    assert (out / "requests.parquet").is_file()
    assert _gone(str(out)) == []


def test_generator_dies_with_a_kill_9_parent(tmp_path: Path, echo_url: str) -> None:
    proc, out = _start(tmp_path, echo_url)
    gens = processes_mentioning(str(out))
    proc.kill()
    proc.communicate(timeout=30)
    left = _gone(str(out))
    for pid in left:  # do not leave load running if the test fails
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"generators {gens} outlived their parent"


def test_generator_exits_when_its_parent_is_already_gone(tmp_path: Path) -> None:
    """The watchdog: a generator whose --parent-pid is not its parent stops at once."""
    import json

    cfg = {
        "target_url": "http://127.0.0.1:9",
        "scenario": "chat",
        "records_dir": str(tmp_path),
        "seed": 0,
        "duration_s": 60,
        "request_timeout_s": 5,
        "replica_header": "X",
        "max_in_flight": 4,
        "grace_s": 1,
    }
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "lbtune.loadgen.worker",
            "--config",
            json.dumps(cfg),
            "--parent-pid",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 3, p.stderr
    assert "parent" in p.stdout


def test_sigterm_mid_twin_check_puts_the_live_config_back(tmp_path: Path) -> None:
    """`twin check` applies configs to the live balancer; SIGTERM (a CI runner's cancel)
    used to end it on the spot, the balancer left on a drawn config. Now it unwinds as an
    error would: the live config back, exit 143, one line."""
    from lbtune.targets import get_target
    from tests.conftest import running_cluster

    state = tmp_path / "state"
    with running_cluster(state, time_scale=8.0) as ep:
        target = get_target("haproxy", ep)
        before = target.read_live()
        proc = subprocess.Popen(
            [*LBTUNE, "twin", "check", "-s", "chat", "-n", "3", "-d", "20"],
            env={**os.environ, "LBTUNE_STATE_DIR": str(state)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60  # the second config (least-conn) goes live
            while time.monotonic() < deadline and proc.poll() is None:
                if target.read_live() != before:
                    break
                time.sleep(0.2)
            assert proc.poll() is None, proc.communicate()
            assert target.read_live() != before
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 143, err
        assert "terminated (SIGTERM)" in err and "Traceback" not in err
        assert target.read_live() == before
