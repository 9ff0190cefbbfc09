"""JUnit XML (parsed back with xml.etree), step summaries and --ci exit codes."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from lbtune.cli import ci
from lbtune.objective import Figures, ObjectiveSpec
from lbtune.records.slo import Slo
from lbtune.report.junit import (
    JUnitCase,
    JUnitSuite,
    error_suite,
    stress_suite,
    study_suite,
    to_xml,
    write_junit,
)
from lbtune.search.result import Comparison, Confirmation, Rollout, StudyResult, TrialResult
from tests.report import data

FIG = Figures(p99_e2e_s=1.2, p99_ttft_s=0.3, requests_per_s=5.0, p50_ttft_s=0.1, completed=50)


def study(rollout: Rollout | None = None, **kw: object) -> StudyResult:
    trials = (
        TrialResult(0, "COMPLETE", "live", {"w": 1}, 1.0, (1.0,), FIG, True, duration_s=9.0),
        TrialResult(1, "PRUNED", "sampled", {"w": 2}, duration_s=4.0),
        TrialResult(2, "FAIL", "sampled", {"w": 3}, fail_reason="apply failed: <boom> & \x01"),
        TrialResult(3, "COMPLETE", "sampled", {"w": 4}, 0.8, (0.8,), FIG, True, duration_s=9.0),
    )
    comp = Comparison(3, {"w": 4}, (0.8,), (1.0,), -0.2, -0.3, -0.1, -0.2, True, True, FIG)
    conf = Confirmation("improved", 0, FIG, (comp,), winner=3, runs_per_arm=1, order=("A", "B1"))
    fields: dict[str, object] = dict(
        study="nightly",
        storage="sqlite://",
        target="haproxy",
        scenario="chat",
        sampler="tpe",
        spec=ObjectiveSpec(),
        budget=4,
        trials=trials,
        best=3,
        baseline=0,
        confirmation=conf,
        rollout=rollout,
        elapsed_s=60.0,
        report_dir="reports/x",
    )
    fields.update(kw)
    return StudyResult(**fields)  # type: ignore[arg-type]


def parse(xml: str) -> ET.Element:
    root = ET.fromstring(xml.encode())
    assert root.tag == "testsuites"
    return root


def test_xml_is_the_common_junit_subset_with_consistent_counts(tmp_path: Path) -> None:
    suite = JUnitSuite(
        "s",
        (
            JUnitCase("ok", "c"),
            JUnitCase("bad", "c", "failure", "why <&>", "long\x00text"),
            JUnitCase("skip", "c", "skipped", "not run"),
            JUnitCase("err", "c", "error", "x"),
        ),
        time_s=1.5,
        properties={"k": "v"},
    )
    root = ET.parse(write_junit(tmp_path / "deep" / "j.xml", [suite])).getroot()
    assert root.get("tests") == "4" and root.get("failures") == "1"
    assert root.get("errors") == "1" and root.get("skipped") == "1"
    (ts,) = root.findall("testsuite")
    assert ts.get("name") == "s" and ts.get("time") == "1.500" and ts.get("timestamp")
    assert [p.get("name") for p in ts.iter("property")] == ["k"]
    cases = ts.findall("testcase")
    assert [c.get("name") for c in cases] == ["ok", "bad", "skip", "err"]
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("message") == "why <&>"
    assert failure.text == "long?text"
    assert all(set(c.attrib) == {"name", "classname", "time"} for c in cases)


def test_stress_suite_one_case_per_slo_check() -> None:
    breached = data.summary(slo=Slo(ttft_s=0.1, e2e_s=5.0, max_error_rate=0.5))
    root = parse(to_xml([stress_suite(breached, "reports/r")]))
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) == {"SLO p99_ttft", "SLO p99_e2e", "SLO error_rate"}
    failure = cases["SLO p99_ttft"].find("failure")
    assert failure is not None and "limit 100 ms" in (failure.get("message") or "")
    assert cases["SLO p99_e2e"].find("failure") is None
    (breach,) = ci.slo_breaches(breached)
    assert breach.startswith("p99_ttft ") and breach.endswith(" ms > 100 ms")
    md = ci.stress_markdown(breached, "reports/r")
    assert "SLO breached" in md and "p99_ttft" in md and "reports/r" in md


def test_study_suite_cases_per_trial_confirmation_and_rollout() -> None:
    ok = Rollout(True, "ansible", True, False, "applied and verified", FIG)
    root = parse(to_xml([study_suite(study(ok))]))
    names = [c.get("name") for c in root.iter("testcase")]
    assert names == [
        "trial 0 (live)",
        "trial 1 (sampled)",
        "trial 2 (sampled)",
        "trial 3 (sampled)",
        "confirmation: trial 3 vs baseline",
        "rollout: apply trial 3 via ansible",
        "rollout: verification",
    ]
    assert root.get("failures") == "1" and root.get("skipped") == "1"
    bad = root.find(".//testcase[@name='trial 2 (sampled)']/failure")
    assert bad is not None and "<boom>" in (bad.get("message") or "")
    rolled_back = Rollout(True, "ansible", False, True, "worse; rolled back", FIG)
    root = parse(to_xml([study_suite(study(rolled_back))]))
    assert root.find(".//testcase[@name='rollout: verification']/failure") is not None
    root = parse(to_xml([study_suite(study(None, confirmation=None))]))
    skipped = [c.get("name") for c in root.iter("testcase") if c.find("skipped") is not None]
    assert skipped == ["trial 1 (sampled)", "confirmation", "rollout"]


def test_study_exit_codes() -> None:
    ok = Rollout(True, "ansible", True, False, "applied and verified")
    assert ci.study_exit_code(study(ok)) == 0
    assert ci.study_exit_code(study(None)) == 0  # no winner applied is a result, not a failure
    assert ci.study_exit_code(study(replace(ok, verified=False, rolled_back=True))) == 1
    assert ci.study_exit_code(study(Rollout(False, "ansible", detail="rollout failed: x"))) == 3
    assert ci.study_exit_code(study(None, notes=("could not restore the last known good: x",))) == 3
    assert ci.study_exit_code(study(None, interrupted=True)) == 130
    md = ci.study_markdown(study(ok))
    assert "lbtune optimize `nightly`" in md and "Before / after" not in md and "|" in md


def test_error_suite_records_why_a_command_stopped() -> None:
    root = parse(to_xml([error_suite("stress", RuntimeError("target unreachable"), 2)]))
    err = root.find(".//testcase/error")
    assert err is not None and "target unreachable (exit 2)" in (err.get("message") or "")


def test_step_summary_appends_only_when_set(tmp_path: Path) -> None:
    target = tmp_path / "summary.md"
    assert ci.append_step_summary("# one", env={}) is None
    assert ci.append_step_summary("# one", env={"GITHUB_STEP_SUMMARY": str(target)}) == target
    ci.append_step_summary("# two\n", env={"GITHUB_STEP_SUMMARY": str(target)})
    assert target.read_text() == "# one\n\n# two\n\n"


def test_progress_lines() -> None:
    from lbtune.tune.options import StudyProgress

    got: list[str] = []
    lines = ci.StudyLines(emit=got.append)
    p = StudyProgress(study="s", budget=3)
    lines(p)
    p.done, p.trial, p.role, p.last_value, p.best, p.best_trial = 1, 0, "live", 0.9, 0.9, 0
    lines(p)
    lines(p)  # no change: no line
    p.done, p.trial, p.role, p.failed = 2, 1, "sampled", 1
    lines(p)
    assert got == [
        "trial 0 (live) COMPLETE score 0.900 | best 0.900 (trial 0) | 1/3 done, 0 pruned, 0 failed",
        "trial 1 (sampled) FAIL | best 0.900 (trial 0) | 2/3 done, 0 pruned, 1 failed",
    ]


def test_check_writable_fails_early(tmp_path: Path) -> None:
    from lbtune.errors import ConfigError

    ci.check_writable(tmp_path / "new" / "j.xml")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="--junit"):
        ci.check_writable(tmp_path / "file" / "j.xml")
