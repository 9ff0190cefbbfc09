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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

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
from lbtune.tune.options import OptimizeOptions
from lbtune.tune.optimize import run_optimize
run_optimize(OptimizeOptions(budget=3, scenario=sys.argv[1], trial_duration_s=8,
    study="e2e", storage=sys.argv[2], state_dir=Path(sys.argv[3]), confirm_runs=1,
    confirm_max_rounds=2, out_dir=Path(sys.argv[4]), screen=0))
"""


@contextmanager
def generator_first() -> Iterator[None]:
    """This process, and so the load generators it starts, five steps ahead in CPU priority
    where the machine permits it (root, or CAP_SYS_NICE), for the duration.

    The generator is the instrument: when a busy machine schedules it late, a first token
    it reads together with the next one has an arrival it cannot bound, and a trial of
    such records is rightly not trusted. With the suite's four workers and a busy loop on
    one of two cores, every trial of the before/after study went untrusted that way (and
    nothing was confirmed); the test is about the before/after arithmetic, so the
    instrument is given the CPU it needs, as a load test's generator should be."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, before - 5)
    except PermissionError:
        yield
        return
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


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


@pytest.mark.timeout(400)  # a hang guard: 136 s measured on a busy 2-core machine
def test_study_killed_mid_trial_resumes_confirms_and_rolls_out(tmp_path: Path) -> None:
    from lbtune.targets import get_target
    from lbtune.targets.lkg import LkgStore
    from lbtune.tune.optimize import run_optimize
    from lbtune.tune.options import OptimizeOptions

    scenario = tmp_path / "quick.yaml"
    # Not streamed: what is tested is the kill, the resume, the confirmation and the
    # rollout, none of which needs a TTFT. A TTFT's timing bound is what a busy machine
    # (the suite's other workers) most often cannot hold, and the generator then rightly
    # flags the confirmation's baseline runs, which left the study without a verdict.
    scenario.write_text(SCENARIO.replace("stream: true", "stream: false"))
    db = tmp_path / "studies.db"
    storage = f"sqlite:///{db}"
    state = tmp_path / "state"
    with running_cluster(state) as endpoints:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
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

        res = run_optimize(
            OptimizeOptions(
                budget=3,
                resume=True,
                study="e2e",
                storage=storage,
                state_dir=state,
                confirm_runs=1,
                confirm_max_rounds=2,  # a bound on the time, not the figures under test
                out_dir=tmp_path / "r2",
            )
        )
        dead = res.trial(killed)
        assert dead is not None and dead.state == "FAIL"
        assert dead.fail_reason == "interrupted: process died"
        assert res.scenario == str(scenario)  # stored options were reused on --resume
        assert len(res.trials) == 3 and res.baseline == 0
        assert res.trial(0) is not None and res.trial(0).role == "live"  # type: ignore[union-attr]
        c = res.confirmation
        assert c is not None and c.verdict in (
            "improved",
            "no significant improvement",
            "baseline is best",
        )
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
        assert c.runs_per_arm <= 2  # the confirmation's round cap held


@pytest.mark.timeout(300)
def test_study_before_after_equals_a_same_round_recomputation(tmp_path: Path) -> None:
    """A tiny real study; its report's before/after figures recomputed from the records.

    The live config sends almost everything to the L4, slowed down 2x for the test, so
    round robin or least-conn beats it and confirmation runs. Every before/after figure
    (tails, P50 TTFT, throughput, sample counts) is recomputed from the confirmation runs'
    ``requests.parquet`` and ``run.json`` windows of the rounds the comparison used, and
    must be exactly equal.
    """
    from lbtune.loadgen.recordio import read_records
    from lbtune.metrics.censor import censored_samples
    from lbtune.metrics.stats import throughput
    from lbtune.metrics.summary import Window
    from lbtune.records.quantiles import percentile
    from lbtune.report.study_frame import before_after, shown_comparison
    from lbtune.scenario.runplan import read_run_plan
    from lbtune.targets import get_target
    from lbtune.tune.optimize import run_optimize
    from lbtune.tune.options import OptimizeOptions

    scenario = tmp_path / "quick.yaml"
    # Fewer users than the kill/resume test, and long prompts (the slowed L4 far behind).
    # The score reads only P99 E2E: the better configs' TTFTs are ~15 ms, which a busy
    # machine's generator (a bound of 5-7 ms with the suite's other workers) cannot time
    # to 5 %; twice in CI every trial but the live config's (~300 ms TTFTs) went untrusted
    # by that bound, and nothing was confirmed. An E2E score does not read TTFTs.
    scenario.write_text(
        SCENARIO.replace("users: 12", "users: 8").replace(
            "prompt_tokens: {type: lognormal, median: 150, sigma: 0.8, min: 8, max: 2048}",
            "prompt_tokens: {type: lognormal, median: 1500, sigma: 0.5, min: 256, max: 4096}",
        )
    )
    state = tmp_path / "state"
    out = tmp_path / "r"
    with running_cluster(state) as endpoints:
        target = get_target("haproxy", endpoints)
        skewed = {**target.space().baseline(), "weight.h100-0": 1, "weight.l4-0": 256}
        target.apply(skewed)
        l4 = next(r for r in endpoints.replicas if r.name == "l4-0")
        requests.post(
            f"{l4.url}/admin/slowdown", json={"factor": 2.0}, timeout=5
        ).raise_for_status()
        with generator_first():
            res = run_optimize(
                OptimizeOptions(
                    # The live config, both references and one sampled trial: a trial the
                    # generator could not measure on time (a busy machine) is rightly not
                    # trusted, and the confirmation needs one trusted trial better than the
                    # live config (in a clean-clone CI run with other work on the machine,
                    # round robin's and least-conn's both were not trusted).
                    budget=4,
                    scenario=str(scenario),
                    trial_duration_s=8,
                    study="paired",
                    screen=0,  # live trials only: the twin's screen is tests/tune/test_screen.py's
                    storage=f"sqlite:///{tmp_path / 's.db'}",
                    state_dir=state,
                    confirm_runs=1,
                    confirm_top=1,
                    confirm_max_rounds=2,
                    apply=False,
                    out_dir=out,
                    seed=5,
                    # The score reads P99 E2E only (see the scenario's comment): a TTFT
                    # bound too wide then untrusts nothing (CI: the live config's round,
                    # TTFT P99 320 ms, bound 24.5 ms > 16 ms, went unmeasured when the
                    # default weights still read TTFTs).
                    weights="e2e=1,ttft=0,decay=0",
                )
            )
    c = res.confirmation
    if c is None or not c.comparisons:  # every trial in full (an assert's repr is cut short)
        pytest.fail(
            "\n".join(
                [f"no comparison: {None if c is None else c.note}"]
                + [
                    f"{t.number} {t.role} {t.state} {t.objective} {t.fail_reason}"
                    for t in res.trials
                ]
            )
        )
    assert c is not None
    comp = shown_comparison(res)
    why = [(r.round, r.arm, r.reason) for r in c.rounds if not r.measured]
    assert comp is not None and comp.rounds and c.baseline_trial == 0, why
    q = c.quantile
    name = f"P{q:g}"

    def recompute(arm: str) -> tuple[list[float], list[float], list[float]]:
        e2e: list[float] = []
        ttft: list[float] = []
        rates: list[float] = []
        for r in c.rounds:
            if r.arm != arm or not r.measured or r.round not in comp.rounds:
                continue
            plan = read_run_plan(out / "runs" / r.label)
            assert plan.window_start is not None and plan.window_end is not None
            records = read_records(out / "runs" / r.label / "requests.parquet")
            cs = censored_samples(records, start=plan.window_start, end=plan.window_end)
            e2e += cs.e2e
            ttft += cs.streamed_ttft
            window = Window(plan.window_start, plan.window_end)
            rates.append(throughput(records, window, None).requests_per_s)
        return e2e, ttft, rates

    rows = {row[0]: row for row in before_after(res).rows}
    printed, same_round = [], []
    for col, arm in ((1, "A"), (2, comp.arm)):
        e2e, ttft, rates = recompute(arm)
        expect = {
            f"{name} end-to-end latency (ms)": percentile(e2e, q) * 1000.0,
            f"{name} time to first token (ms)": percentile(ttft, q) * 1000.0,
            "P50 time to first token (ms)": percentile(ttft, 50) * 1000.0,
            "throughput (req/s)": sum(rates) / len(rates),
            "latency samples (requests)": len(e2e),
        }
        for key, value in expect.items():
            assert rows[key][col] == value, (arm, key, rows[key][col], value)
        printed.append({k: rows[k][col] for k in expect})
        same_round.append(expect)
    print("before/after (printed):", printed)
    print("before/after (same-round recomputation):", same_round)
    t0 = res.trial(0)
    if t0 is not None and t0.figures is not None:  # what the old table used as "before"
        print("trial 0's search run (no longer a column):", t0.figures.p99_e2e_s * 1000.0)
    data = json.loads((out / "study.json").read_text())
    shown = next(x for x in data["confirmation"]["comparisons"] if x["trial"] == comp.trial)
    e2e, _, _ = recompute("A")
    assert shown["baseline"]["tail_e2e_s"] == percentile(e2e, q)
    assert shown["rounds"] == list(comp.rounds)
    # Each trial's plan as it ran is the one its run directory recorded.
    for t in res.trials:
        if t.state != "COMPLETE":
            continue
        label = f"trial-{t.number:04d}"
        runs = out / "runs"
        ran = read_run_plan(
            runs / (f"{label}-rerun" if (runs / f"{label}-rerun").is_dir() else label)
        )
        assert t.plan == ran and ran.window_start is not None
        assert data["trials"][t.number]["plan"]["window_start"] == ran.window_start
    # The live checkpoints (the records' tail while the load ran) reached the study: the
    # live trial has intermediate values (its 5 s window has checkpoints at 2 and 4 s).
    # The pruner's use of them is tested in virtual time (tests/search/test_pruning_twin.py).
    assert t0 is not None and t0.intermediate, [(t.number, t.role, t.state) for t in res.trials]
    assert all(0 < v < float("inf") for v in t0.intermediate.values()), t0.intermediate
