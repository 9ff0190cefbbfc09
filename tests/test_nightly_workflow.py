"""The nightly tuning workflow: valid, scheduled only, and its `run:` steps work in order.

The integration test runs the `run:` steps of `.github/workflows/nightly-tune.yml` in
order, as GitHub would (``bash --noprofile --norc -eo pipefail``, the job's ``env:``,
``$GITHUB_STEP_SUMMARY``), against the embedded cluster with a tiny budget:
``${{ ... }}`` expressions are evaluated with empty secrets and inputs, and the nightly
knobs are overridden (mini2, 2 trials of 6 s, no confirmation runs, a twin refit without
validation runs; outputs in tmp).
Skipped, and why: ``uses:`` steps (checkout, cache, artifact upload: GitHub's own
actions, not shell) and the install step (``scripts/setup.sh``: the test already runs
inside the venv it made). Any ``LBTUNE_STAGING_*`` in the caller's environment is
removed, so this never sends load anywhere but to the embedded cluster.

The refit step's choices (which baseline, what is kept, its knobs) are tested without a
cluster, with ``tests/fake_lbtune.py`` as ``lbtune``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
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
    assert steps == ["up", "tune", "gate", "drift", "refit", "remember", "down"]
    (refit,) = [s for s in job["steps"] if s.get("run") == "scripts/nightly.sh refit"]
    assert refit["if"] == "${{ !cancelled() }}"  # runs whether or not the gates failed
    assert evaluate(job["env"]["LBTUNE_NIGHTLY_FAIL_ON_DRIFT"], {}) == "10%"
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
    assert job["variables"]["LBTUNE_NIGHTLY_FAIL_ON_DRIFT"] == "10%"  # `all` runs the refit


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
        LBTUNE_NIGHTLY_REFIT="fit",  # the fit's probes only: no validation runs
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
        assert len(ran) == 7 and len(skipped) == 6
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
        # The first refit has nothing to compare with: its profile is kept.
        assert "no comparison tonight: no twin profile kept yet" in ran[4][1].stderr
        kept = nightly / "twin-profile.json"
        assert kept.read_text() == (report / "twin-profile.json").read_text()

        # The next night: a fresh cluster gets the accepted config back, and the gate
        # compares against the accepted study (here the same measurements: no regression).
        up = run("scripts/nightly.sh up", "up (next night)")
        assert "putting the last accepted config back" in up.stderr
        _refit_finds_a_slower_replica(run, kept, report)
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


def _refit_finds_a_slower_replica(run: Callable[..., Any], kept: Path, report: Path) -> None:
    """The next night's refit against the kept profile, hand-edited so that l4-0 was ten
    times faster: every replica gets a drift line, l4-0 is named and the step fails; the
    edited profile stays the baseline, tonight's fit is in the report."""
    profile = json.loads(kept.read_text())
    (l4,) = [r for r in profile["replicas"] if r["name"] == "l4-0"]
    l4["step_s"] = {"value": l4["step_s"]["value"] / 10, "rel_uncertainty": 0.0}
    rate = l4["prefill_tokens_per_s"]["value"] * 10
    l4["prefill_tokens_per_s"] = {"value": rate, "rel_uncertainty": 0.0}
    kept.write_text(json.dumps(profile))
    refit = run("scripts/nightly.sh refit", "refit (next night)", expect=1)
    assert "drift h100-0:" in refit.stdout and "drift l4-0: decode +" in refit.stdout
    assert "drift: l4-0 is " in refit.stderr and "(more than 10%)" in refit.stderr
    assert "the kept twin profile stays the baseline" in refit.stderr
    assert json.loads(kept.read_text()) == profile
    tonight = json.loads((report / "twin-profile.json").read_text())
    assert tonight["measured_at"] >= profile["measured_at"] and tonight != profile


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


# The refit step without a cluster: tests/fake_lbtune.py stands in for lbtune.

FAKE = ROOT / "tests" / "fake_lbtune.py"


def _nightly(
    tmp: Path, step: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    """``scripts/nightly.sh STEP`` with the fake lbtune; its result and the fake's calls."""
    calls = tmp / "calls.jsonl"
    calls.unlink(missing_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("LBTUNE_")}
    full = base | {
        "LBTUNE_BIN": f"{sys.executable} {FAKE}",
        "LBTUNE_NIGHTLY_DIR": str(tmp / "nightly"),
        "LBTUNE_NIGHTLY_REPORT": str(tmp / "nightly/reports/1"),
        "LBTUNE_STATE_DIR": str(tmp / "state"),
        "GITHUB_STEP_SUMMARY": str(tmp / "summary.md"),
        "FAKE_CALLS": str(calls),
    }
    cmd = ["bash", str(ROOT / "scripts/nightly.sh"), step]
    proc = subprocess.run(cmd, env=full | env, capture_output=True, text=True, timeout=60)
    lines = calls.read_text().splitlines() if calls.exists() else []
    return proc, [json.loads(x) for x in lines]


def _fits(calls: list[list[str]]) -> list[list[str]]:
    return [c[2:] for c in calls if c[:2] == ["twin", "fit"]]


def test_refit_keeps_a_passing_fit_and_compares_the_next_night_with_it(tmp_path: Path) -> None:
    kept, tonight = tmp_path / "nightly/twin-profile.json", tmp_path / "nightly/reports/1"
    first, calls = _nightly(tmp_path, "refit")
    assert first.returncode == 0, first.stderr
    (fit,) = _fits(calls)
    assert fit == ["-s", "chat", "-d", "30", "--save", f"{tonight}/twin-profile.json"]
    assert "no comparison tonight: no twin profile kept yet" in first.stderr
    assert kept.read_text() == (tonight / "twin-profile.json").read_text()
    assert (tonight / "twin-fit.txt").read_text() in first.stdout

    second, calls = _nightly(tmp_path, "refit", FAKE_AT="2026-01-02T02:17:00+00:00")
    assert second.returncode == 0, second.stderr
    (fit,) = _fits(calls)
    assert fit[-4:] == ["--baseline", str(kept), "--fail-on-drift", "10%"]
    assert "drift h100-0: decode +50%" in second.stdout
    assert json.loads(kept.read_text())["measured_at"] == "2026-01-02T02:17:00+00:00"
    summary = (tmp_path / "summary.md").read_text()
    assert "### Twin refit (no comparison: no twin profile kept yet)" in summary
    assert "### Twin refit (against the profile fitted 2026-01-01T02:17:00+00:00)" in summary


def test_refit_past_the_drift_limit_fails_and_keeps_the_old_baseline(tmp_path: Path) -> None:
    _nightly(tmp_path, "refit")
    kept = tmp_path / "nightly/twin-profile.json"
    before = kept.read_text()
    proc, calls = _nightly(
        tmp_path, "refit", FAKE_FIT_RC="1", FAKE_AT="later", LBTUNE_NIGHTLY_FAIL_ON_DRIFT="25%"
    )
    assert proc.returncode == 1
    assert _fits(calls)[0][-2:] == ["--fail-on-drift", "25%"]
    assert kept.read_text() == before  # a slower replica does not become the new normal
    assert "the kept twin profile stays the baseline" in proc.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert "drift: h100-0 is 50% slower than in B (more than 10%)" in summary


@pytest.mark.parametrize(
    ("env", "args"),
    [
        ({"LBTUNE_NIGHTLY_FAIL_ON_DRIFT": "off"}, ["-s", "chat", "-d", "30", "--save", "{save}",
         "--baseline", "{kept}"]),
        ({"LBTUNE_NIGHTLY_REFIT": "fit"}, ["-s", "chat", "-d", "30", "--save", "{save}",
         "--no-validate", "--baseline", "{kept}", "--fail-on-drift", "10%"]),
        ({"LBTUNE_NIGHTLY_REFIT_SCENARIO": "longctx", "LBTUNE_NIGHTLY_REFIT_S": "60"},
         ["-s", "longctx", "-d", "60", "--save", "{save}", "--baseline", "{kept}",
          "--fail-on-drift", "10%"]),
    ],
    ids=["drift-off", "no-validate", "scenario"],
)  # fmt: skip
def test_refit_knobs_reach_the_fit(tmp_path: Path, env: dict[str, str], args: list[str]) -> None:
    _nightly(tmp_path, "refit")  # the first night keeps a profile
    proc, calls = _nightly(tmp_path, "refit", **env)
    assert proc.returncode == 0, proc.stderr
    save = tmp_path / "nightly/reports/1/twin-profile.json"
    kept = tmp_path / "nightly/twin-profile.json"
    assert _fits(calls) == [[a.format(save=save, kept=kept) for a in args]]


@pytest.mark.parametrize(
    ("env", "kept", "rc", "says"),
    [
        ({}, {"cluster": "hetero4", "time_scale": 1.0}, 0,
         "no comparison tonight: the kept profile is of hetero4 at time scale 1, "
         "tonight the cluster is mini2 at 4"),
        ({}, "not json", 0, "no comparison tonight: the kept profile .* cannot be read "
         "\\(JSONDecodeError\\)"),
        ({"LBTUNE_NIGHTLY_REFIT": "off"}, None, 0, "LBTUNE_NIGHTLY_REFIT=off: no twin refit"),
        ({"LBTUNE_NIGHTLY_REFIT": "yes"}, None, 2, "LBTUNE_NIGHTLY_REFIT=yes: expected "
         "validate, fit or off"),
        ({"FAKE_DOWN": "1"}, None, 0, "no cluster running \\(the up step failed\\): skipping"),
    ],
    ids=["other-cluster", "unreadable", "off", "bad-knob", "no-cluster"],
)  # fmt: skip
def test_refit_without_a_comparison(
    tmp_path: Path, env: dict[str, str], kept: dict[str, object] | str | None, rc: int, says: str
) -> None:
    """A kept profile of another cluster (or time scale: wall times are not comparable) or
    one that cannot be read: the fit runs without it, says why, and its profile is kept.
    Off, a bad knob, no cluster: no fit at all."""
    _nightly(tmp_path, "refit")  # the first night keeps a profile
    profile = tmp_path / "nightly/twin-profile.json"
    if isinstance(kept, dict):
        profile.write_text(json.dumps({**json.loads(profile.read_text()), **kept}))
    elif kept is not None:
        profile.write_text(kept)
    proc, calls = _nightly(tmp_path, "refit", FAKE_AT="tonight", **env)
    assert proc.returncode == rc, proc.stderr
    assert re.search(says, proc.stderr), proc.stderr
    if kept is None:
        assert _fits(calls) == []
        return
    (fit,) = _fits(calls)
    assert "--baseline" not in fit
    assert json.loads(profile.read_text())["measured_at"] == "tonight"


def test_all_runs_the_refit_after_drift_and_before_down(tmp_path: Path) -> None:
    """GitLab and cron run `scripts/nightly.sh all`: the refit is in it, in its place."""
    proc, calls = _nightly(tmp_path, "all")
    assert proc.returncode == 0, proc.stderr
    commands = [" ".join(c[:2]) for c in calls]
    assert commands.index("optimize --ci") < commands.index("twin fit")
    assert commands.index("twin fit") < commands.index("cluster down")
    # the fake study left no report: gate, drift and remember skip, the refit does not
    log = proc.stderr
    assert (
        log.index("skipping drift")
        < log.index("no comparison tonight")
        < log.index("skipping remember")
    )
