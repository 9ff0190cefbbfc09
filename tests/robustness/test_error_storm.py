"""Defect 15 of issue 16: against a target that fails every request at once, closed-loop
users back off (exponentially, capped) instead of resending at once, and the report says
that the offered load collapsed into retries."""

from __future__ import annotations

from pathlib import Path

import pytest

SCENARIO = """\
name: storm
duration_s: 3
load: {type: constant, users: 4}
models: {x-http-500: 1}
prompt_tokens: {type: fixed, value: 8}
output_tokens: {type: fixed, value: 4}
"""


@pytest.mark.integration
def test_users_back_off_and_the_report_says_so(tmp_path: Path, echo_url: str) -> None:
    from lbtune.loadgen.recordio import read_records
    from lbtune.run.stress import StressOptions, run_stress

    scen = tmp_path / "storm.yaml"
    scen.write_text(SCENARIO)
    res = run_stress(
        StressOptions(
            scenario=str(scen),
            target_url=echo_url,
            out_dir=tmp_path / "o",
            reports_root=tmp_path,
            write_report=False,
        )
    )
    recs = read_records(res.records_path)
    assert recs and all(r.outcome == "http_error" for r in recs)
    # Without back-off the echo's instant 500s gave thousands of requests in 3 s; with it
    # each user sends at most ~8 (pauses of 50 ms doubling to 2 s fill the 3 s + drain).
    assert len(recs) <= 4 * 10, len(recs)
    assert any("collapsed into retries" in n for n in res.summary.notes), res.summary.notes
    assert not res.summary.generator.degraded, res.summary.generator.reasons


def test_the_backoff_is_exponential_and_capped() -> None:
    import subprocess
    import sys

    code = (
        "from lbtune.loadgen.pacing import backoff_s, BACKOFF_CAP_S;"
        "print([backoff_s(k) for k in (0, 1, 2, 3, 6, 7, 50, 10**6)], BACKOFF_CAP_S)"
    )  # a subprocess: importing lbtune.loadgen.user monkey-patches with gevent
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.strip() == "[0.0, 0.05, 0.1, 0.2, 1.6, 2.0, 2.0, 2.0] 2.0"
