"""Issue 29, class 5: a stress whose target went down mid-run names the outage and exits 3.

Before, a balancer that died under a run (its worker killed) left the run to exit 1 (an
SLO breach) with a report that named no outage: the figures of a dead balancer were read
as the config's. Here the target is the generator's own echo server, stopped while the run
sends: the requests after it are refused.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.robustness.conftest import LBTUNE, cli_env, start_echo

pytestmark = pytest.mark.integration


def _served(url: str) -> int:
    with urllib.request.urlopen(f"{url}/debug/requests", timeout=2) as resp:
        return len(json.load(resp))


@pytest.mark.timeout(120)
def test_a_target_that_goes_down_mid_run_is_an_outage_exit_3(tmp_path: Path) -> None:
    scen = tmp_path / "s.yaml"
    scen.write_text(
        "name: s\nduration_s: 6\nwarmup_s: 0\nload: {type: constant, users: 2}\n"
        "models: {echo: 1}\nprompt_tokens: {type: fixed, value: 8}\n"
        "output_tokens: {type: fixed, value: 4}\n"
    )
    echo, url = start_echo("--ttft", "0.01", "--itl", "0.005")
    out = tmp_path / "o"
    run = subprocess.Popen(
        [*LBTUNE, "stress", "-s", str(scen), "--target", url, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        deadline = time.monotonic() + 60
        while _served(url) < 20:  # the run is sending: then the target goes down
            assert time.monotonic() < deadline and run.poll() is None, "the run never sent"
            time.sleep(0.1)
    finally:
        echo.terminate()
        echo.wait(timeout=10)
    _, err = run.communicate(timeout=90)
    assert run.returncode == 3, err
    assert "Traceback" not in err
    line = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and "outage: the target refused" in line[0], err
    assert str(out) in line[0]
    summary = json.loads((out / "summary.json").read_text())
    assert any(n.startswith("outage: the target refused") for n in summary["notes"])
    assert "outage: the target refused" in (out / "report.md").read_text()


def test_a_run_the_target_answered_throughout_is_no_outage(tmp_path: Path) -> None:
    from lbtune.records.requests import Outcome, RequestRecord
    from lbtune.run.summary import outage

    def rec(i: int, outcome: Outcome, error: str | None = None) -> RequestRecord:
        return RequestRecord(
            request_id=str(i), index=i, model="m", api="chat", stream=True,
            sent_at=100.0 + i, ended_at=100.5 + i, outcome=outcome, error=error,
        )  # fmt: skip

    fine = [rec(0, "ok"), rec(1, "timeout", "no end after 5 s"), rec(2, "http_error", "HTTP 503")]
    assert outage(fine, 100.0) is None
    timed_out = rec(3, "connect_error", "cannot connect to 127.0.0.1:1: timed out")
    assert outage([*fine, timed_out], 100.0) is None  # slow to accept is not down
    down = [rec(4, "connect_error", "[Errno 111] Connection refused")]
    down.append(rec(7, "connect_error", "[Errno 111] Connection refused"))
    note = outage([*fine, *down], 100.0)
    assert note is not None and "refused 2 connections from 4.0 s to 7.0 s" in note
