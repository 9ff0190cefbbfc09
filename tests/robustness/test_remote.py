"""Defect 16 of issue 16: options that reach beyond loopback need --allow-remote, and a
worker whose master never answers honours Ctrl-C promptly."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from lbtune.cluster.resolve import free_port as _free_port
from tests.robustness.conftest import LBTUNE, processes_mentioning, run_cli, wait_for_stop


@pytest.mark.parametrize(
    "args",
    [
        ["--master", "--master-bind", "0.0.0.0"],
        ["--master", "--master-bind", "192.0.2.1"],
        ["--worker", "--master-host", "192.0.2.1"],
        ["--worker", "--master-host", "example.invalid"],
        ["--prometheus", "http://192.0.2.1:9090"],
        ["--prometheus", "http://0.0.0.0:9090"],
    ],
    ids=lambda a: " ".join(a),
)
def test_a_remote_option_needs_allow_remote(tmp_path: Path, echo_url: str, args: list[str]) -> None:
    r = run_cli("stress", "--target", echo_url, "-d", "2", *args, "--out", str(tmp_path / "o"))
    assert r.rc == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.lines()
    assert len(lines) == 1 and "--allow-remote" in lines[0], r.stderr
    assert not (tmp_path / "o").exists(), "nothing may start"


@pytest.mark.integration
def test_a_worker_without_master_honours_ctrl_c(tmp_path: Path, echo_url: str) -> None:
    out = tmp_path / "w"
    proc = subprocess.Popen(
        [
            *LBTUNE,
            "stress",
            "--target",
            echo_url,
            "--worker",
            "--master-port",
            str(_free_port()),
            "-d",
            "90",  # ignoring Ctrl-C would keep it running past STOP_S
            "--out",
            str(out),
            "--ci",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Ready once the generator process has been started (its --config names ``out``): the
    # CLI itself mentions ``out`` from its exec on, still importing on a busy machine.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not set(processes_mentioning(str(out))) - {proc.pid}:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    time.sleep(1.0)  # let the worker start waiting for its master
    proc.send_signal(signal.SIGINT)
    err = wait_for_stop(proc, str(out))  # before the fix it waited 93 s for its master
    assert "Traceback" not in err
    assert proc.returncode == 130, err
    assert processes_mentioning(str(out)) == []
