"""`lbtune capacity --users`: flags and scenarios that cannot search users are one line
and exit 2, before anything runs; a search over users (the live probe replaced by a
hand-made curve) probes whole counts and reports its capacity in users."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lbtune.capacity.compare import load_report
from lbtune.capacity.probes import LiveProbe
from lbtune.capacity.search import ProbeResult
from lbtune.cli import main
from lbtune.run.stress import StressOptions
from lbtune.scenario.loader import trace_ref
from tests.capacity.curves import CurveProbe, logistic


def _main(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["lbtune", "capacity", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    return int(exit_.value.code or 0)


def _fake_live(monkeypatch: pytest.MonkeyPatch, curve: CurveProbe) -> list[StressOptions]:
    """The live probe replaced by ``curve``; the stress options it would have run."""
    ran: list[StressOptions] = []

    def call(self: LiveProbe, level: float) -> ProbeResult:
        ran.append(self.probes.next(level))
        return curve(level)

    monkeypatch.setattr(LiveProbe, "__call__", call)
    return ran


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--users", "--start-users", "0"], "--start-users: a whole number of users, 1 to "),
        (["--users", "--start-users", "-3"], "--start-users: a whole number of users, 1 to "),
        (["--users", "--start-rate", "2"], "--start-rate is a rate (req/s) and --users"),
        (["--start-users", "4"], "--start-users counts closed-loop users: add --users"),
        (["--users", "--probe-samples", "500"], "with --users a probe lasts the scenario's"),
        (["--start-rate", "0"], "--start-rate: must be 0.05 to 10000 req/s, got 0"),
    ],
)
def test_flags_that_cannot_search_users_are_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    flags: list[str],
    says: str,
) -> None:
    ran = _fake_live(monkeypatch, CurveProbe(lambda n: 1.0, n=100))
    code = _main(monkeypatch, "--slo", "ttft=1s", "--no-twin", "--out", str(tmp_path), *flags)
    assert code == 2
    assert says in _one_line(capsys)
    assert ran == [] and not (tmp_path / "capacity.json").exists()  # nothing ran


def test_a_trace_that_sets_its_own_arrivals_cannot_search_users(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "azure.csv"
    rows = [f"2023-11-16 18:15:{i:02d}.0000000,{40 + i},{5 + i}" for i in range(40)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    ran = _fake_live(monkeypatch, CurveProbe(lambda n: 1.0, n=100))
    args = ["-s", trace_ref(trace, "azure", 2.0), "--slo", "ttft=1s", "--no-twin", "--users"]
    assert _main(monkeypatch, *args, "--out", str(tmp_path / "out")) == 2
    assert "--users/--rate do not apply" in _one_line(capsys)
    assert ran == []


def test_a_search_over_users_reports_a_whole_capacity_in_users(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    curve = logistic(7.4, 0.99, width=0.3)  # 7 users meet 99 %, 8 do not
    ran = _fake_live(monkeypatch, CurveProbe(curve, n=5000))
    args = ["-s", "chat", "--slo", "ttft=1s", "--no-twin", "--users", "--start-users", "3"]
    assert _main(monkeypatch, *args, "--out", str(tmp_path), "--json") == 0
    out = json.loads(capsys.readouterr().out)
    live = out["live"]
    assert live["unit"] == "users" and live["kind"] == "bracketed" and live["converged"]
    assert live["capacity"] == 7 and live["ci"] == [7, 8]
    assert [p["rate"] for p in live["probes"]] == [3, 6, 12, 9, 8, 7, 7, 8]
    assert [o.users for o in ran] == [3, 6, 12, 9, 8, 7, 7, 8]
    assert all(o.rate is None for o in ran)
    assert _main(monkeypatch, *args, "--out", str(tmp_path)) == 0
    captured = capsys.readouterr()
    head = "capacity: 7 users (90% CI 7–8); runs differ by ±0% of load (2 probes near it)"
    assert f"{head}; converged" in captured.out
    assert "req/s" not in captured.out
    assert "live probe 12 users: " in captured.err


def test_a_baseline_in_another_unit_is_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _fake_live(monkeypatch, CurveProbe(logistic(12.0, 0.99, width=0.5), n=5000))
    args = ["-s", "chat", "--slo", "ttft=1s", "--no-twin"]
    assert _main(monkeypatch, *args, "--out", str(tmp_path / "rate")) == 0
    capsys.readouterr()
    ran = _fake_live(monkeypatch, CurveProbe(logistic(12.0, 0.99, width=0.5), n=5000))
    gate = ["--baseline", str(tmp_path / "rate"), "--fail-on", "capacity=-5%"]
    assert _main(monkeypatch, *args, "--users", *gate) == 2
    err = _one_line(capsys)
    assert "its capacity is in req/s and this search's in users" in err
    assert "searched with --users" in err and ran == []


def test_a_capacity_json_without_a_unit_reads_back_as_req_s(tmp_path: Path) -> None:
    """Files written before the unit field was: their capacity was a rate."""
    frame = {
        "source": "live",
        "kind": "above",
        "capacity": 8.0,
        "ci": None,
        "converged": False,
        "stopped": None,
        "cliff": None,
        "curve": [[8.0, 1.0]],
        "probes": [],
        "wall_s": 1.0,
    }
    old = {
        "scenario": "chat",
        "target": "the embedded cluster",
        "slo": {"ttft_s": 1.0},
        "attainment": 0.99,
        "precision": 0.1,
        "confidence": 0.9,
        "live": frame,
    }
    (tmp_path / "capacity.json").write_text(json.dumps(old))
    report = load_report(tmp_path)
    assert report.live is not None and report.live.unit == "req/s"
    (tmp_path / "capacity.json").write_text(json.dumps({**old, "live": {**frame, "unit": "users"}}))
    report = load_report(tmp_path)
    assert report.live is not None and report.live.unit == "users"
