"""A fault of issue 16's probe: Prometheus stops in the middle of ``lbtune stress``. The run
goes on, the client-side report is written and marked incomplete with the reason, every
request is accounted for, and the command ends with one warning, not a traceback.

(The library-level case, a replica crash and Prometheus lost in one run, is
``tests/run/test_failures.py``.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import running_cluster
from tests.robustness.conftest import LBTUNE, cli_env

pytestmark = pytest.mark.integration

SCENARIO = """\
name: tiny
duration_s: 10
load: {type: constant, users: 4}
models: {llama-3.1-8b-instruct: 1}
prompt_tokens: {type: fixed, value: 16}
output_tokens: {type: fixed, value: 8}
"""


@pytest.mark.timeout(300)
def test_prometheus_killed_mid_run_leaves_an_incomplete_report(tmp_path: Path) -> None:
    scen = tmp_path / "tiny.yaml"
    scen.write_text(SCENARIO)
    out = tmp_path / "run"
    with running_cluster(tmp_path / "state", time_scale=8.0) as ep:
        prom_pid = json.loads((Path(ep.state_dir) / "prometheus.pid").read_text())["pid"]
        proc = subprocess.Popen(
            [
                *LBTUNE,
                "stress",
                "--scenario",
                str(scen),
                "--state-dir",
                ep.state_dir,
                "--out",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                if sum(p.stat().st_size for p in out.glob("records-*.jsonl")) > 2000:
                    break  # load is flowing
                time.sleep(0.1)
            assert proc.poll() is None, proc.communicate()
            os.kill(prom_pid, signal.SIGKILL)
            stdout, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr + stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["incomplete"] is True
    assert any("Prometheus" in n for n in summary["notes"]), summary["notes"]
    every = summary["all_outcomes"]
    assert every["sent"] > 0 and every["sent"] == sum(every["counts"].values())
    assert every["counts"]["ok"] > 0  # the load went on without Prometheus
    assert (out / "report.html").is_file() and (out / "report.md").is_file()
    assert "INCOMPLETE" in stdout
