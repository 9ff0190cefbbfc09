"""Defects 8 and 17 of issue 16: before any load, the target is asked (with a real
request) which models it serves; a scenario naming another is refused, nothing sent."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.robustness.conftest import frontend_total, run_cli

pytestmark = pytest.mark.integration

WRONG_MODEL = """\
name: wrong
duration_s: 5
load: {type: constant, users: 2}
models: {llama-3.1-8b-instruct: 1, no-such-model: 1}
prompt_tokens: {type: fixed, value: 8}
output_tokens: {type: fixed, value: 4}
"""


def _settled(ep: Any, column: str) -> int:
    """The counter once two reads a moment apart agree (HAProxy updates it on close)."""
    last = frontend_total(ep, column)
    for _ in range(50):
        time.sleep(0.1)
        now = frontend_total(ep, column)
        if now == last:
            return now
        last = now
    return last


def test_the_reachability_probe_adds_no_failed_request(mini2: Any) -> None:
    from lbtune.loadgen.runner import LoadConfig, _check_target
    from lbtune.run.target import check_reachable

    u = urlsplit(mini2.balancer_url)
    before = _settled(mini2, "ereq")
    socket.create_connection((u.hostname, u.port), timeout=5).close()  # the control
    bare = _settled(mini2, "ereq")
    assert bare == before + 1, "a bare TCP connect is an ereq: the counter reading works"
    served = check_reachable(mini2.balancer_url)
    _check_target(LoadConfig(target_url=mini2.balancer_url, scenario="chat", records_dir="."))
    assert _settled(mini2, "ereq") == bare
    assert served is not None and "llama-3.1-8b-instruct" in served


@pytest.mark.parametrize("external", [False, True], ids=["embedded", "target"])
def test_a_model_the_target_does_not_serve_is_refused(
    tmp_path: Path, mini2: Any, external: bool
) -> None:
    scen = tmp_path / "wrong.yaml"
    scen.write_text(WRONG_MODEL)
    sent, refused = _settled(mini2, "req_tot"), _settled(mini2, "hrsp_4xx")
    where = ["--target", mini2.balancer_url] if external else ["--state-dir", mini2.state_dir]
    r = run_cli("stress", "-s", str(scen), *where, "--out", str(tmp_path / "o"))
    assert r.rc == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.lines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert "no-such-model" in lines[0] and "llama-3.1-70b-instruct-awq" in lines[0]
    # Only probes (GET /v1/models, the cluster's status): a run would send hundreds.
    assert _settled(mini2, "req_tot") <= sent + 5
    assert _settled(mini2, "hrsp_4xx") == refused, "no request for the unserved model"
    assert not (tmp_path / "o" / "requests.parquet").exists()
