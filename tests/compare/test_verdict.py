"""`lbtune compare` on synthetic report directories: verdicts, thresholds, formats, exit codes."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lbtune.cli import app
from lbtune.compare.verdict import compare, load_pair, load_side, parse_fail_on
from lbtune.errors import ConfigError
from lbtune.loadgen.recordio import write_parquet
from lbtune.metrics.stats import summarize
from lbtune.metrics.summary import Window
from lbtune.records.requests import RequestRecord
from lbtune.records.slo import Slo
from lbtune.report import write_report
from lbtune.report.compare import render_json, render_markdown

T0 = 1_700_000_000.0
WINDOW = Window(T0 + 3, T0 + 27)


def records(
    scale: float = 1.0, seed: int = 0, n: int = 600, errors: int = 0
) -> list[RequestRecord]:
    """``n`` streamed requests over 30 s, lognormal TTFT and ITL; latencies times ``scale``."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        sent = T0 + i * 30 / n
        ttft = float(rng.lognormal(np.log(0.08), 0.5)) * scale
        ntok = int(rng.integers(20, 60))
        gaps = rng.lognormal(np.log(0.02), 0.3, ntok - 1) * scale
        chunks = tuple(float(x) for x in sent + ttft + np.concatenate([[0.0], np.cumsum(gaps)]))
        bad = i % max(1, n // errors) == 0 if errors else False
        out.append(
            RequestRecord(
                request_id=f"r{i}",
                index=i,
                model="m",
                api="chat",
                stream=True,
                sent_at=sent,
                ended_at=chunks[-1] + 0.001,
                outcome="http_error" if bad else "ok",
                status_code=500 if bad else 200,
                first_token_at=None if bad else sent + ttft,
                chunk_times=() if bad else chunks,
                prompt_tokens=100,
                output_tokens=ntok,
                replica=f"rep{i % 2}",
            )
        )
    return out


def write_run(out: Path, recs: list[RequestRecord], *, with_records: bool = True) -> Path:
    summary = summarize(
        recs,
        run_start=T0,
        window=WINDOW,
        scenario="chat",
        target="http://127.0.0.1:8000",
        slo=Slo(ttft_s=0.35, e2e_s=5.0),
    )
    write_report(out, summary, recs)
    if with_records:
        write_parquet(recs, out / "requests.parquet")
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare")
    return {
        "a": write_run(root / "a", records(seed=0)),
        "a2": write_run(root / "a2", records(seed=1)),
        "slow": write_run(root / "slow", records(scale=1.5, seed=2)),
        "bare": write_run(root / "bare", records(scale=1.5, seed=2), with_records=False),
        "errors": write_run(root / "errors", records(seed=3, errors=30)),
    }


def test_point_estimates_from_records_equal_the_summary(runs: dict[str, Path]) -> None:
    a, b = load_pair(runs["a"], runs["slow"])
    result = compare(a, b, resamples=200)
    for f in result.figures:
        assert f.a == pytest.approx(a.figures[f.key], rel=1e-12), f.key
        assert f.b == pytest.approx(b.figures[f.key], rel=1e-12), f.key


def test_identical_runs_show_no_significant_change(runs: dict[str, Path]) -> None:
    for other in ("a", "a2"):
        result = compare(*load_pair(runs["a"], runs[other]))
        assert result.verdict == "no significant change", render_markdown(result)
        assert not result.failed
        assert all(f.status == "noise" and f.ci is not None for f in result.figures)
        if other == "a":
            assert all(f.change == 0 for f in result.figures)


def test_latencies_times_1_5_are_a_regression_named_in_the_markdown(
    runs: dict[str, Path],
) -> None:
    result = compare(*load_pair(runs["a"], runs["slow"]))
    assert result.failed and result.verdict == "regression"
    by = {f.key: f for f in result.figures}
    assert by["e2e_p99"].failed and by["e2e_p99"].change == pytest.approx(0.5, abs=0.12)
    assert by["itl_p50"].status == "regression"
    assert by["itl_p50"].ci is not None and by["itl_p50"].ci[0] > 0.4
    assert by["requests_per_s"].status == "noise"  # same request count, same window
    md = render_markdown(result)
    head = md.split("|")[0]  # the part before the table names what regressed
    assert "Regressed beyond the thresholds" in head and "P99 E2E" in head


def test_thresholds_are_respected(runs: dict[str, Path]) -> None:
    a, b = load_pair(runs["a"], runs["slow"])
    loose = compare(a, b, fail_on=parse_fail_on("p99=+80%,ttft=+80%"))
    assert not loose.failed and loose.verdict == "regression within thresholds"
    assert {f.key for f in loose.regressions} >= {"e2e_p99", "itl_p50"}
    only_itl = compare(a, b, fail_on=parse_fail_on("itl=+20%"))
    assert [f.key for f in only_itl.failures] == ["itl_p50"]
    none = compare(a, b, fail_on={})
    assert not none.failed and all(f.threshold is None for f in none.figures)


def test_improvement_is_the_mirror_image(runs: dict[str, Path]) -> None:
    result = compare(*load_pair(runs["slow"], runs["a"]))
    assert not result.failed and result.verdict == "improvement"
    assert "e2e_p99" in {f.key for f in result.improvements}


def test_error_rate_is_compared_in_points(runs: dict[str, Path]) -> None:
    result = compare(*load_pair(runs["a"], runs["errors"]), fail_on=parse_fail_on("errors=+1%"))
    err = next(f for f in result.figures if f.key == "error_rate")
    assert not err.relative and err.change == pytest.approx(err.b or 0.0)
    assert err.status == "regression" and err.failed
    assert "pp" in render_markdown(result)


def test_without_records_the_summaries_are_compared_untested(runs: dict[str, Path]) -> None:
    result = compare(*load_pair(runs["a"], runs["bare"]))
    assert not result.failed and result.verdict == "not tested (no records)"
    assert all(f.status == "untested" and f.ci is None for f in result.figures)
    assert any("no records: not tested for significance" in n for n in result.notes)
    assert result.figures[2].change == pytest.approx(0.5, abs=0.12)


def test_same_seed_same_intervals_and_json_round_trip(runs: dict[str, Path]) -> None:
    a, b = load_pair(runs["a"], runs["a2"])
    one, two = compare(a, b, seed=7), compare(a, b, seed=7)
    assert [f.ci for f in one.figures] == [f.ci for f in two.figures]
    data = json.loads(render_json(one))
    assert data["verdict"] == "no significant change" and data["failed"] is False
    assert {f["key"] for f in data["figures"]} >= {"ttft_p99", "e2e_p99", "goodput_per_s"}
    assert data["a"]["records"] is True and data["b"]["requests"] > 0


def test_a_summary_json_file_reads_its_records_from_its_folder(runs: dict[str, Path]) -> None:
    side = load_side(runs["a"] / "summary.json")
    assert side.kind == "stress" and side.arrays is not None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "p99=+10%,ttft=+10%,goodput=-5%",
            {"e2e_p99": 0.10, "ttft_p99": 0.10, "goodput_per_s": 0.05},
        ),
        ("p99=10%", {"e2e_p99": 0.10}),
        ("errors=+1pp", {"error_rate": 0.01}),
        ("all=0%,p99=+20%", {"e2e_p99": 0.20}),
    ],
)
def test_parse_fail_on(text: str, expected: dict[str, float]) -> None:
    got = parse_fail_on(text)
    for k, v in expected.items():
        assert got[k] == pytest.approx(v)
    if text.startswith("all"):
        assert len(got) == 8 and got["ttft_p50"] == 0


@pytest.mark.parametrize(
    ("text", "needle"),
    [("p98=+10%", "p98"), ("p99=fast", "+10%"), ("goodput=+5%", "goodput=-5")],
)
def test_parse_fail_on_errors_name_the_problem(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match="--fail-on") as exc:
        parse_fail_on(text)
    assert needle in str(exc.value)


# --- the command ----------------------------------------------------------------------


def test_cli_exit_codes_and_formats(runs: dict[str, Path], tmp_path: Path) -> None:
    cli = CliRunner()
    same = cli.invoke(app, ["compare", str(runs["a"]), str(runs["a2"]), "--format", "md"])
    assert same.exit_code == 0, same.output
    assert "no significant change" in same.output
    slow = cli.invoke(app, ["compare", str(runs["a"]), str(runs["slow"]), "--format", "json"])
    assert slow.exit_code == 1
    assert "e2e_p99" in json.loads(slow.output)["failures"]
    loose = cli.invoke(
        app, ["compare", str(runs["a"]), str(runs["slow"]), "--fail-on", "p99=+80%,ttft=+80%"]
    )
    assert loose.exit_code == 0, loose.output
    assert "regression within thresholds" in loose.output


def test_cli_ci_junit_and_step_summary(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import xml.etree.ElementTree as ET

    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit = tmp_path / "out" / "compare.xml"
    res = CliRunner().invoke(
        app, ["compare", str(runs["a"]), str(runs["slow"]), "--ci", "--junit", str(junit)]
    )
    assert res.exit_code == 1
    assert "\x1b[" not in res.output  # no colour in --ci
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "8"
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert "P99 E2E" in failed and suite.get("failures") == str(len(failed))
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "lbtune compare: regression" in text


def _lbtune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lbtune", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["{missing}", "{a}"], "no-such-report"),
        (["{a}", "{empty}"], "neither summary.json"),
        (["{a}", "{a}", "--fail-on", "p98=+1%"], "--fail-on"),
        (["{a}", "{a}", "--format", "html"], "--format"),
        (["{a}"], "a single report compares only for a study"),
        (["{a}", "{junk}"], "neither a stress summary.json nor an optimize study.json"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    runs: dict[str, Path], tmp_path: Path, args: list[str], needle: str
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk.json").write_text('{"a": 1}')
    paths = {
        "a": runs["a"],
        "missing": tmp_path / "no-such-report",
        "empty": tmp_path / "empty",
        "junk": tmp_path / "junk.json",
    }
    proc = _lbtune("compare", *(a.format(**paths) for a in args))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]


def test_a_figure_that_is_zero_on_side_a_has_no_ratio(runs: dict[str, Path]) -> None:
    """A relative change from 0 (a run with no throughput on side A) is "no ratio", not a
    ZeroDivisionError: the figures of summaries are plain floats, not numpy's."""
    a, b = load_pair(runs["a"], runs["bare"])
    zero = dataclasses.replace(a, figures={**a.figures, "requests_per_s": 0.0})
    result = compare(zero, b)
    fig = next(f for f in result.figures if f.key == "requests_per_s")
    assert fig.change is None and fig.note == "A is zero: no ratio"
