"""A short real study on the embedded cluster: kill -9 mid-trial, resume, confirm, roll out.

One test to save time (~2 minutes): a study runs in a subprocess and is killed with
SIGKILL while a trial is running; ``--resume`` (in-process) puts the balancer back on
the last known good, marks the dead trial FAIL, finishes the budget, confirms against
the baseline and either rolls out a confirmed winner through Ansible (and verifies it)
or reports "no significant improvement" with the last known good live.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import running_cluster

pytestmark = pytest.mark.integration

SCENARIO = """\
name: quick
description: a short chat load for optimize tests
seed: 5
duration_s: 8
warmup_s: 2
cooldown_s: 1
slo: {ttft: 1s, e2e: 10s}
load: {type: constant, users: 12}
api: chat
models: {llama-3.1-8b-instruct: 1}
prompt_tokens: {type: lognormal, median: 150, sigma: 0.8, min: 8, max: 2048}
output_tokens: {type: lognormal, median: 60, sigma: 0.5, min: 16, max: 256}
stream: true
"""

CHILD = """
import sys
from pathlib import Path
from lbtune.optimize import OptimizeOptions, run_optimize
run_optimize(OptimizeOptions(budget=4, scenario=sys.argv[1], trial_duration_s=8,
    study="e2e", storage=sys.argv[2], state_dir=Path(sys.argv[3]), confirm_runs=1,
    out_dir=Path(sys.argv[4])))
"""


def _running_trial(db: Path) -> int | None:
    import sqlite3

    if not db.exists():
        return None
    try:
        with sqlite3.connect(db) as con:
            row = con.execute(
                "SELECT number FROM trials WHERE state = 'RUNNING' ORDER BY number DESC"
            ).fetchone()
    except sqlite3.Error:
        return None
    return None if row is None else int(row[0])


@pytest.mark.timeout(240)
def test_study_killed_mid_trial_resumes_confirms_and_rolls_out(tmp_path: Path) -> None:
    from lbtune.apply.lkg import LkgStore
    from lbtune.optimize import OptimizeOptions, run_optimize
    from lbtune.targets import get_target

    scenario = tmp_path / "quick.yaml"
    scenario.write_text(SCENARIO)
    db = tmp_path / "studies.db"
    storage = f"sqlite:///{db}"
    state = tmp_path / "state"
    with running_cluster(state) as endpoints:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(scenario), storage, str(state), str(tmp_path / "r1")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (_running_trial(db) or 0) < 1:
            assert child.poll() is None, "the study ended before it could be killed"
            time.sleep(0.3)
        time.sleep(3.0)  # well inside trial 1's load
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        killed = _running_trial(db)
        assert killed is not None and killed >= 1

        t0 = time.monotonic()
        res = run_optimize(
            OptimizeOptions(
                budget=4,
                resume=True,
                study="e2e",
                storage=storage,
                state_dir=state,
                confirm_runs=1,
                out_dir=tmp_path / "r2",
            )
        )
        took = time.monotonic() - t0
        dead = res.trial(killed)
        assert dead is not None and dead.state == "FAIL"
        assert dead.fail_reason == "interrupted: process died"
        assert res.scenario == str(scenario)  # stored options were reused on --resume
        assert len(res.trials) == 4 and res.baseline == 0
        assert res.trial(0) is not None and res.trial(0).role == "live"  # type: ignore[union-attr]
        c = res.confirmation
        assert c is not None and c.verdict in (
            "improved", "no significant improvement", "baseline is best"
        )  # fmt: skip
        target = get_target("haproxy", endpoints)
        live = target.read_live()
        lkg = LkgStore(state, "haproxy").get()
        assert lkg is not None
        if c.winner is not None:
            r = res.rollout
            assert r is not None and r.applied and r.via == "ansible"
            if r.verified:
                assert live == res.trial(c.winner).params  # type: ignore[union-attr]
                assert lkg.params == live
        if res.rollout is None or not res.rollout.verified:
            assert live == lkg.params  # nothing applied: the last known good is live
        data = json.loads((tmp_path / "r2" / "study.json").read_text())
        assert data["counts"]["fail"] >= 1 and data["confirmation"]["verdict"] == c.verdict
        assert took < 150
