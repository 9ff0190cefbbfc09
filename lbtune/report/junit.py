"""JUnit XML for CI systems: each SLO check, comparison figure and study step a test case.

The XML keeps to the subset every consumer reads (the Ant/Jenkins ``junit.xsd`` that
GitHub, GitLab, Jenkins and Azure render): ``<testsuites>`` holding ``<testsuite>``
elements with ``name``, ``tests``, ``failures``, ``errors``, ``skipped``, ``time``,
``timestamp`` and ``hostname``, optional ``<properties>``, and ``<testcase name
classname time>`` with at most one ``<failure message type>``, ``<error>`` or
``<skipped message>`` and an optional ``<system-out>``. Text is stripped of the
characters XML 1.0 forbids.

Builders (pure): :func:`stress_suite` (one case per SLO check), :func:`compare_suite`
(one per figure), :func:`study_suite` (one per trial, confirmation comparison and
rollout step), :func:`error_suite` (a command that could not finish).
"""

from __future__ import annotations

import json
import re
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from lbtune.report.compare import change, interval, limit, verdict
from lbtune.safety.secrets import scrub

if TYPE_CHECKING:
    from lbtune.compare.verdict import CompareResult
    from lbtune.metrics.summary import RunSummary, SloCheck
    from lbtune.search.result import StudyResult

_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
Outcome = Literal["passed", "failure", "error", "skipped"]


@dataclass(frozen=True)
class JUnitCase:
    name: str
    classname: str
    outcome: Outcome = "passed"
    message: str = ""
    """The one-line reason of a failure, error or skip."""
    detail: str = ""
    """Longer text: the body of ``<failure>``/``<error>``, else ``<system-out>``."""
    time_s: float = 0.0


@dataclass(frozen=True)
class JUnitSuite:
    name: str
    cases: tuple[JUnitCase, ...]
    time_s: float = 0.0
    timestamp: float = field(default_factory=time.time)
    properties: Mapping[str, str] = field(default_factory=dict)

    def count(self, outcome: Outcome) -> int:
        return sum(c.outcome == outcome for c in self.cases)


def _clean(text: str) -> str:
    return _FORBIDDEN.sub("?", text)


_COUNTED: tuple[tuple[str, Outcome], ...] = (
    ("failures", "failure"),
    ("errors", "error"),
    ("skipped", "skipped"),
)


def _counts(el: ET.Element, suites: Sequence[JUnitSuite]) -> None:
    el.set("tests", str(sum(len(s.cases) for s in suites)))
    for key, outcome in _COUNTED:
        el.set(key, str(sum(s.count(outcome) for s in suites)))
    el.set("time", f"{sum(s.time_s for s in suites):.3f}")


def to_xml(suites: Sequence[JUnitSuite], name: str = "lbtune") -> str:
    root = ET.Element("testsuites", name=_clean(name))
    _counts(root, suites)
    host = socket.gethostname()
    for s in suites:
        el = ET.SubElement(root, "testsuite", name=_clean(s.name))
        _counts(el, [s])
        el.set("timestamp", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s.timestamp)))
        el.set("hostname", host)
        if s.properties:
            props = ET.SubElement(el, "properties")
            for k, v in s.properties.items():
                ET.SubElement(props, "property", name=_clean(k), value=_clean(str(v)))
        for c in s.cases:
            tc = ET.SubElement(
                el,
                "testcase",
                name=_clean(c.name),
                classname=_clean(c.classname),
                time=f"{max(0.0, c.time_s):.3f}",
            )
            if c.outcome != "passed":
                child = ET.SubElement(tc, c.outcome, message=_clean(c.message))
                if c.outcome != "skipped":
                    child.set(
                        "type", "lbtune." + ("regression" if c.outcome == "failure" else "error")
                    )
                    child.text = _clean(c.detail or c.message)
            if c.detail and c.outcome in ("passed", "skipped"):
                ET.SubElement(tc, "system-out").text = _clean(c.detail)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"


def write_junit(path: Path | str, suites: Sequence[JUnitSuite]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(scrub(to_xml(suites)), encoding="utf-8")  # no secret of this process
    return p


# --- builders -----------------------------------------------------------------------


def _check_text(c: SloCheck) -> tuple[str, str]:
    """(figure, limit) in display units."""
    if c.name == "error_rate":
        v = "–" if c.value is None else f"{c.value * 100:.2f} %"
        return v, f"{c.target * 100:g} %"
    v = "–" if c.value is None else f"{c.value * 1000:.0f} ms"
    return v, f"{c.target * 1000:g} ms"


def stress_suite(summary: RunSummary, report_dir: str | None = None) -> JUnitSuite:
    """One case per SLO check: fails when the check failed, skipped when not measurable."""
    cls = f"lbtune.stress.{summary.scenario}"
    cases = []
    for c in summary.slo_checks:
        value, target = _check_text(c)
        text = f"{c.name} {value} (limit {target})" + (f"; {c.detail}" if c.detail else "")
        if c.ok is None:
            case = JUnitCase(f"SLO {c.name}", cls, "skipped", f"not measured: {text}")
        elif c.ok:
            case = JUnitCase(f"SLO {c.name}", cls, detail=f"met: {text}")
        else:
            case = JUnitCase(f"SLO {c.name}", cls, "failure", f"SLO breached: {text}", text)
        cases.append(case)
    if not cases:
        cases.append(JUnitCase("SLO", cls, "skipped", "no SLO given (--slo or the scenario's)"))
    props = {
        "scenario": summary.scenario,
        "target": summary.target,
        "requests_sent": str(summary.outcomes.sent),
    }
    if report_dir:
        props["report"] = report_dir
    return JUnitSuite(
        f"lbtune stress {summary.scenario}",
        tuple(cases),
        summary.window.duration,
        summary.run_start,
        props,
    )


def compare_suite(result: CompareResult, elapsed_s: float = 0.0) -> JUnitSuite:
    """One case per figure: fails on a significant regression beyond its limit."""
    cases = []
    for f in result.figures:
        text = f"{f.label}: {change(f)} (CI {interval(f)}, limit {limit(f)}): {verdict(f)}"
        if f.failed:
            case = JUnitCase(f.label, "lbtune.compare", "failure", text, text)
        elif f.status == "untested":
            case = JUnitCase(f.label, "lbtune.compare", "skipped", f.note or "untested")
        else:
            case = JUnitCase(f.label, "lbtune.compare", detail=text)
        cases.append(case)
    props = {"a": result.a.path, "b": result.b.path, "verdict": result.verdict}
    return JUnitSuite("lbtune compare", tuple(cases), elapsed_s, properties=props)


def study_suite(result: StudyResult) -> JUnitSuite:
    """One case per trial, per confirmation comparison and per rollout step."""
    cls = f"lbtune.optimize.{result.study}"
    cases: list[JUnitCase] = []
    for t in result.trials:
        name = f"trial {t.number} ({t.role})"
        if t.state == "FAIL":
            reason = t.fail_reason or "failed"
            cases.append(JUnitCase(name, cls, "failure", reason, reason, t.duration_s or 0.0))
        elif t.state == "PRUNED":
            cases.append(JUnitCase(name, cls, "skipped", "pruned: worse than the median so far"))
        elif t.state != "COMPLETE":
            cases.append(JUnitCase(name, cls, "skipped", f"not finished ({t.state})"))
        else:
            score = "–" if t.objective is None else f"{t.objective:.3f}"
            ok = "" if t.feasible is not False else "; infeasible (error rate over the limit)"
            params = json.dumps(dict(t.params), sort_keys=True, default=str)
            detail = f"score {score}{ok}; params {params}"
            cases.append(JUnitCase(name, cls, detail=detail, time_s=t.duration_s or 0.0))
    c = result.confirmation
    if c is None or c.verdict == "not run":
        cases.append(JUnitCase("confirmation", cls, "skipped", "confirmation not run"))
    elif not c.comparisons:
        cases.append(JUnitCase("confirmation", cls, detail=c.verdict))
    for x in c.comparisons if c is not None else ():
        what = "winner" if x.trial == c.winner else ("better" if x.significant else "not better")  # type: ignore[union-attr]
        detail = f"score diff {x.diff:+.3f} (95 % CI {x.ci_low:+.3f} .. {x.ci_high:+.3f}): {what}"
        cases.append(JUnitCase(f"confirmation: trial {x.trial} vs baseline", cls, detail=detail))
    cases.extend(_rollout_cases(result, cls))
    props = {
        "study": result.study,
        "scenario": result.scenario,
        "target": result.target,
        "verdict": "none" if c is None else c.verdict,
    }
    if result.report_dir:
        props["report"] = result.report_dir
    return JUnitSuite(
        f"lbtune optimize {result.study}", tuple(cases), result.elapsed_s, properties=props
    )


def _rollout_cases(result: StudyResult, cls: str) -> list[JUnitCase]:
    r, c = result.rollout, result.confirmation
    if r is None:
        why = "no confirmed winner: nothing applied"
        if c is not None and c.winner is not None:
            why = "not applied (--no-apply or stopped)"
        return [JUnitCase("rollout", cls, "skipped", why)]
    name = f"rollout: apply trial {c.winner if c else '?'} via {r.via}"
    if not r.applied:
        skipped = JUnitCase("rollout: verification", cls, "skipped", "nothing was applied")
        return [JUnitCase(name, cls, "error", r.detail, r.detail), skipped]
    verify = JUnitCase("rollout: verification", cls, detail=r.detail)
    if r.rolled_back:
        verify = JUnitCase("rollout: verification", cls, "failure", r.detail, r.detail)
    return [JUnitCase(name, cls, detail="applied"), verify]


def error_suite(command: str, exc: BaseException, exit_code: int) -> JUnitSuite:
    """A command that stopped with an error: one errored case, so CI shows why."""
    text = f"{exc} (exit {exit_code})"
    return JUnitSuite(
        f"lbtune {command}", (JUnitCase(command, f"lbtune.{command}", "error", text),)
    )
