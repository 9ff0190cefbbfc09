"""The nightly tuning workflow: valid, scheduled only, and its `run:` steps work in order.

The integration test runs the `run:` steps of `.github/workflows/nightly-tune.yml` in
order, as GitHub would (``bash --noprofile --norc -eo pipefail``, the job's ``env:``,
``$GITHUB_STEP_SUMMARY``), against the embedded cluster with a tiny budget:
``${{ ... }}`` expressions are evaluated with empty secrets and inputs, and the nightly
knobs are overridden (mini2, 2 trials of 6 s, no confirmation runs; outputs in tmp).
Skipped, and why: ``uses:`` steps (checkout, cache, artifact upload: GitHub's own
actions, not shell) and the install step (``scripts/setup.sh``: the test already runs
inside the venv it made). Any ``LBTUNE_STAGING_*`` in the caller's environment is
removed, so this never sends load anywhere but to the embedded cluster.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.untrusted import untrusted_study

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly-tune.yml"
GITLAB = ROOT / "ci" / "gitlab-nightly.yml"
_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def _workflow() -> dict[Any, Any]:
    data = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(data, dict)
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads a bare `on` as true
    return data


def evaluate(text: str, ctx: dict[str, str]) -> str:
    """``${{ a || 'b' }}`` → the first non-empty operand; unknown contexts are an error."""

    def one(m: re.Match[str]) -> str:
        for operand in (o.strip() for o in m.group(1).split("||")):
            if operand[:1] == "'" and operand[-1:] == "'":
                value = operand[1:-1]
            elif operand in ctx:
                value = ctx[operand]
            elif operand.split(".")[0] in ("secrets", "inputs"):
                value = ""  # unset secrets and inputs are empty strings on GitHub
            else:
                raise AssertionError(f"the test cannot evaluate {operand!r} in {text!r}")
            if value:
                return value
        return ""

    return _EXPR.sub(one, text)


def test_workflow_runs_only_on_a_schedule_or_by_hand() -> None:
    wf = _workflow()
    assert set(wf["on"]) == {"schedule", "workflow_dispatch"}  # never on push / pull request
    (cron,) = [c["cron"] for c in wf["on"]["schedule"]]
    assert len(cron.split()) == 5
    assert wf["permissions"] == {"contents": "read"}
    (job,) = wf["jobs"].values()
    runs = [s["run"] for s in job["steps"] if "run" in s]
    # `runner.temp` is not allowed in a job's env: the first step exports the state dir.
    assert runs[0] == 'echo "LBTUNE_STATE_DIR=$RUNNER_TEMP/lbtune-state" >> "$GITHUB_ENV"'
    assert runs[1] == "scripts/setup.sh"  # the README's install command
    steps = [r.removeprefix("scripts/nightly.sh ") for r in runs[2:]]
    assert steps == ["up", "tune", "gate", "drift", "remember", "down"]
    uses = [s["uses"].split("@")[0] for s in job["steps"] if "uses" in s]
    assert "actions/upload-artifact" in uses and "actions/cache/save" in uses
    # Secrets reach the job only as the two staging variables, nowhere else.
    text = WORKFLOW.read_text()
    assert sorted(re.findall(r"secrets\.(\w+)", text)) == [
        "LBTUNE_STAGING_CLUSTER",
        "LBTUNE_STAGING_INVENTORY",
    ]


def test_every_workflow_passes_actionlint() -> None:
    """GitHub refuses to start a workflow with a context error (``runner`` in a job's env),
    and actions on a removed runtime stop working: actionlint knows both."""
    binary = shutil.which("actionlint") or str(Path(sys.executable).with_name("actionlint"))
    assert Path(binary).exists(), "actionlint missing: pip install -e '.[dev]'"
    workflows = sorted((ROOT / ".github/workflows").glob("*.yml"))
    assert workflows
    cmd = [binary, *map(str, workflows)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_gitlab_job_runs_only_scheduled_and_calls_the_same_script() -> None:
    (job,) = yaml.safe_load(GITLAB.read_text()).values()
    assert job["script"] == ["scripts/nightly.sh all"]
    assert all("schedule" in r["if"] or "LBTUNE_NIGHTLY" in r["if"] for r in job["rules"])
    assert "scripts/setup.sh" in " ".join(job["before_script"])
    assert job["artifacts"]["reports"]["junit"].endswith("junit.xml")


def test_nightly_script_refuses_an_unknown_step() -> None:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/nightly.sh"), "nope"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "usage" in proc.stderr


@pytest.mark.integration
def test_workflow_run_steps_in_order_on_the_embedded_cluster(tmp_path: Path) -> None:
    from lbtune.cluster import api
    from lbtune.history.store import HistoryStore

    wf = _workflow()
    (job,) = wf["jobs"].values()
    ctx = {"github.run_id": "4242", "runner.temp": str(tmp_path)}
    env = {k: evaluate(str(v), ctx) for k, v in job["env"].items()}
    assert env["LBTUNE_STAGING_CLUSTER"] == "" and env["LBTUNE_STAGING_INVENTORY"] == ""
    nightly, report, state = tmp_path / "nightly", tmp_path / "nightly/reports/4242", tmp_path / "s"
    env.update(
        LBTUNE_NIGHTLY_BUDGET="2",
        LBTUNE_NIGHTLY_TRIAL_S="6",
        LBTUNE_NIGHTLY_CONFIRM_RUNS="0",
        LBTUNE_NIGHTLY_SCREEN="6",  # the knob reaches optimize; 100 would cost minutes
        LBTUNE_NIGHTLY_CLUSTER="mini2",
        LBTUNE_NIGHTLY_DIR=str(nightly),
        LBTUNE_NIGHTLY_REPORT=str(report),
        LBTUNE_STATE_DIR=str(state),
        LBTUNE_BIN=f"{sys.executable} -m lbtune",
        GITHUB_STEP_SUMMARY=str(tmp_path / "summary.md"),
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("LBTUNE_STAGING_")}
    full_env = {**base, **env, "CI": "true", "GITHUB_ACTIONS": "true"}
    ran, skipped = [], []
    untrusted: list[subprocess.CompletedProcess[str]] = []

    def run(script: str, name: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
            cwd=ROOT,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=400,
        )
        if script.endswith(" tune") and untrusted_study(proc.returncode, proc.stderr):
            # A machine too busy to measure on: every trial's generator fell behind, was
            # re-run once and failed again, and the study applied nothing (exit 3), as it
            # must. The job goes on (the next steps run `if: !cancelled()`), and so does
            # the test: they must cope with such a night too.
            untrusted.append(proc)
            return proc
        assert proc.returncode == expect, f"step {name!r} exited {proc.returncode}:\n{proc.stderr}"
        return proc

    try:
        for step in job["steps"]:
            name = step.get("name", step.get("uses"))
            if "run" not in step or not step["run"].startswith("scripts/nightly.sh"):
                skipped.append(name)
                continue
            if step["run"].endswith(" remember"):
                # The tiny study cannot find a winner: pretend it accepted one, so that
                # the next night has a reference.
                study = json.loads((report / "study.json").read_text())
                study["rollout"] = {"applied": True, "verified": True, "rolled_back": False}
                (report / "study.json").write_text(json.dumps(study))
            script = evaluate(step["run"], {**ctx, **{f"env.{k}": v for k, v in env.items()}})
            ran.append((name, run(script, name)))
        assert len(ran) == 6 and len(skipped) == 6
        assert "nightly: target: embedded" in ran[0][1].stderr
        assert "the twin screened 6 configs" in ran[1][1].stderr
        ET.parse(report / "junit.xml")  # valid JUnit XML
        assert (report / "study.json").is_file() and (report / "history.html").is_file()
        summary = (tmp_path / "summary.md").read_text()
        assert "lbtune optimize" in summary and "No accepted study yet" in summary
        assert "History and drift" in summary
        (entry,) = HistoryStore(nightly / "studies.db").entries()
        assert entry.kind == "study" and entry.report_dir == str(report)
        assert not api.status(state).running
        assert (nightly / "accepted").read_text().strip() == str(report)
        assert "params:" in (nightly / "accepted-params.yaml").read_text()

        # The next night: a fresh cluster gets the accepted config back, and the gate
        # compares against the accepted study (here the same measurements: no regression).
        up = run("scripts/nightly.sh up", "up (next night)")
        assert "putting the last accepted config back" in up.stderr
        if untrusted or _baseline_untrusted(report / "study.json"):
            # The accepted study has no measured baseline (every trial, or only the live
            # config's, was rightly not trusted on a busy machine): the gate says so, exit 2.
            gate = run("scripts/nightly.sh gate", "gate (next night)", expect=2)
            assert "the study has no measured baseline trial to compare" in gate.stderr
            return
        run("scripts/nightly.sh gate", "gate (next night)")
        ET.parse(report / "compare-junit.xml")
        assert "lbtune compare" in (tmp_path / "summary.md").read_text()
    finally:
        api.down(state)


def _baseline_untrusted(study_json: Path) -> bool:
    """The study's baseline trial (the live config) failed because the load generator's
    timing was not trusted (a busy machine), so there is nothing to gate against."""
    study = json.loads(study_json.read_text())
    base = next((t for t in study["trials"] if t.get("role") == "live"), None)
    return (
        base is not None
        and base["state"] == "FAIL"
        and (base.get("fail_reason") or "").startswith("load generator fell behind")
    )


def test_only_a_study_the_generator_could_not_measure_is_let_through() -> None:
    """tests/untrusted.py: exit 3, nothing applied, every trial failed untrusted."""
    one = "trial 0: the measurement is not trusted (load generator fell behind: ...)\n"
    two = one.replace("trial 0", "trial 1")
    end = "trial 1 (least-conn) FAIL | best - | 2/2 done, 0 pruned, {f} failed\nnothing applied\n"
    assert untrusted_study(3, one + two + end.format(f=2))
    assert not untrusted_study(0, one + two + end.format(f=2))  # exit 0 is judged as usual
    assert not untrusted_study(1, one + two + end.format(f=2))
    assert not untrusted_study(3, one + end.format(f=2))  # one failure had another cause
    assert not untrusted_study(3, one + two + end.format(f=1))  # a trial completed
    assert not untrusted_study(3, one + two + end.format(f=2).replace("nothing applied", ""))
