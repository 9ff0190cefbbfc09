"""`stress` and `optimize` with --ci/--junit at the CLI edge (the library is stubbed)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lbtune.cli import app
from lbtune.metrics.summary import RunSummary
from lbtune.records.slo import Slo
from lbtune.report import ReportPaths
from lbtune.search.result import Rollout
from tests.report import data
from tests.report.test_junit import study


@pytest.fixture
def step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    p = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(p))
    return p


@dataclass(frozen=True)
class FakeLoad:
    stopped_early: bool = False


@dataclass(frozen=True)
class FakeStressResult:
    """What the stress command reads of :class:`lbtune.run.stress.StressResult`."""

    summary: RunSummary
    report: ReportPaths | None = None
    load: FakeLoad = field(default_factory=FakeLoad)


def _stub_stress(monkeypatch: pytest.MonkeyPatch, slo: Slo) -> None:
    def fake(opts: object, **kw: object) -> FakeStressResult:
        assert callable(kw["on_progress"])  # the CLI always passes a progress callback
        return FakeStressResult(data.summary(slo=slo))

    monkeypatch.setattr("lbtune.run.stress.run_stress", fake)


def test_stress_ci_exits_1_on_an_slo_breach_and_writes_junit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, step: Path
) -> None:
    _stub_stress(monkeypatch, Slo(ttft_s=0.1, e2e_s=5.0, max_error_rate=0.5))
    junit = tmp_path / "j.xml"
    res = CliRunner().invoke(app, ["stress", "--ci", "--junit", str(junit)])
    assert res.exit_code == 1, res.output
    assert "SLO breached (--ci: exit 1): p99_ttft" in res.output
    assert "\x1b[" not in res.output
    root = ET.parse(junit).getroot()
    assert root.get("failures") == "1" and root.get("tests") == "3"
    assert "SLO breached: p99_ttft" in step.read_text()
    # Without --ci a breach is reported, not an exit code (unchanged behaviour).
    assert CliRunner().invoke(app, ["stress"]).exit_code == 0


def test_stress_ci_passes_when_the_slo_is_met(monkeypatch: pytest.MonkeyPatch, step: Path) -> None:
    _stub_stress(monkeypatch, Slo(ttft_s=5.0, e2e_s=5.0, max_error_rate=0.5))
    res = CliRunner().invoke(app, ["stress", "--ci"])
    assert res.exit_code == 0, res.output
    assert "SLO met" in step.read_text()


def test_a_junit_path_that_cannot_be_written_fails_before_any_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from lbtune.errors import ConfigError

    monkeypatch.setattr("lbtune.run.stress.run_stress", lambda *a, **k: pytest.fail("load sent"))
    (tmp_path / "f").write_text("")
    res = CliRunner().invoke(app, ["stress", "--ci", "--junit", str(tmp_path / "f" / "j.xml")])
    assert isinstance(res.exception, ConfigError) and "--junit" in str(res.exception)


def test_stress_error_is_recorded_in_junit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from lbtune.errors import TargetError

    def fail(*a: Any, **k: Any) -> Any:
        raise TargetError("target http://127.0.0.1:1 is unreachable")

    monkeypatch.setattr("lbtune.run.stress.run_stress", fail)
    junit = tmp_path / "j.xml"
    res = CliRunner().invoke(app, ["stress", "--ci", "--junit", str(junit)])
    assert isinstance(res.exception, TargetError)
    err = ET.parse(junit).getroot().find(".//testcase/error")
    assert err is not None and "unreachable (exit 2)" in (err.get("message") or "")


@pytest.mark.parametrize(
    ("rollout", "ci", "code"),
    [
        (Rollout(True, "ansible", True, False, "applied and verified"), True, 0),
        (Rollout(True, "ansible", False, True, "worse; rolled back"), True, 1),
        (Rollout(True, "ansible", False, True, "worse; rolled back"), False, 0),
        (Rollout(False, "ansible", detail="rollout failed: playbook"), True, 3),
    ],
)
def test_optimize_ci_exit_codes_junit_and_step_summary(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    step: Path,
    rollout: Rollout,
    ci: bool,
    code: int,
) -> None:
    got: list[str] = []

    def fake(opts: Any, *, on_progress: Any, stop: Any, say: Any, on_result: Any) -> Any:
        say("phase line")
        got.append(opts.study)
        return study(rollout)

    monkeypatch.setattr("lbtune.tune.optimize.run_optimize", fake)
    junit = tmp_path / "o.xml"
    args = ["optimize", "--study", "nightly", "--junit", str(junit), *(["--ci"] if ci else [])]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == code, res.output
    assert got == ["nightly"]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("name") == "lbtune optimize nightly"
    assert "lbtune optimize `nightly`" in step.read_text()
    if ci:
        assert "phase line" in res.output and "\x1b[" not in res.output
