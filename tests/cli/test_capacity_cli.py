"""`lbtune capacity`: bad and impossible SLOs are one line and exit 2; a search over a
hand-made curve (no server: the live probe is replaced) prints and writes its report."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from lbtune.capacity.probes import LiveProbe
from lbtune.capacity.search import ProbeResult
from lbtune.cli import main
from tests.capacity.curves import CurveProbe, logistic


def _main(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["lbtune", "capacity", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    return int(exit_.value.code or 0)


def _fake_live(monkeypatch: pytest.MonkeyPatch, curve: CurveProbe) -> None:
    def call(self: LiveProbe, rate: float) -> ProbeResult:
        self.probes.next(rate)  # the stress options a live probe would run
        return curve(rate)

    monkeypatch.setattr(LiveProbe, "__call__", call)


@pytest.mark.parametrize(
    ("slo", "says"),
    [
        ("ttft=fast", "--slo ttft: cannot read 'fast'; expected a duration"),
        ("ttfb=1s", "ttfb"),
        ("ttft=0ms", "--slo ttft=0s: no request is served in no time"),
    ],
)
def test_bad_and_impossible_slo_strings_are_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], slo: str, says: str
) -> None:
    assert _main(monkeypatch, "--slo", slo, "--no-twin") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and says in err, err


def test_attainment_out_of_range_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _main(monkeypatch, "--attainment", "100%", "--no-twin") == 2
    assert "--attainment '100%': must be between 0 and 100 %" in capsys.readouterr().err


def test_an_slo_no_rate_meets_is_exit_2_with_the_rate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _fake_live(monkeypatch, CurveProbe(lambda r: 0.5, n=500))
    code = _main(monkeypatch, "--slo", "ttft=1s", "--no-twin", "--out", str(tmp_path))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("error: the SLO is not met even at 0.05 req/s"), err[-1]
    assert (tmp_path / "capacity.json").exists()  # the probes it ran are still reported


def test_search_prints_and_writes_the_capacity(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _fake_live(monkeypatch, CurveProbe(logistic(12.0, 0.99, width=0.8), n=5000))
    args = ["-s", "chat", "--slo", "ttft=1s,tpot=100ms", "--no-twin", "--out", str(tmp_path)]
    assert _main(monkeypatch, *args, "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["slo"]["tpot_s"] == 0.1 and out["attainment"] == 0.99
    live = out["live"]
    assert live["kind"] == "bracketed" and live["converged"]
    assert live["ci"][0] <= 12.0 <= live["ci"][1] and abs(live["capacity"] - 12) < 1.2
    assert json.loads((tmp_path / "capacity.json").read_text()) == out
    assert _main(monkeypatch, *args) == 0
    text = capsys.readouterr().out
    assert "capacity: 1" in text and "90% CI" in text and "converged" in text


def test_fail_on_gates_against_a_baseline(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["-s", "chat", "--slo", "ttft=1s", "--no-twin", "--precision", "5%"]
    _fake_live(monkeypatch, CurveProbe(logistic(12.0, 0.99, width=0.5), n=5000))
    assert _main(monkeypatch, *args, "--out", str(tmp_path / "night1")) == 0
    gate = ["--baseline", str(tmp_path / "night1"), "--fail-on", "capacity=-5%"]
    _fake_live(monkeypatch, CurveProbe(logistic(12.2, 0.99, width=0.5), n=5000))
    assert _main(monkeypatch, *args, "--out", str(tmp_path / "night2"), *gate) == 0
    capsys.readouterr()
    _fake_live(monkeypatch, CurveProbe(logistic(9.0, 0.99, width=0.5), n=5000))
    assert _main(monkeypatch, *args, "--out", str(tmp_path / "night3"), *gate) == 1
    err = capsys.readouterr().err
    assert "FAILED: capacity fell to 7" in err and "more than the 5% allowed" in err
    capsys.readouterr()
    assert _main(monkeypatch, *args, "--fail-on", "capacity=-5%") == 2
    assert "--fail-on needs --baseline" in capsys.readouterr().err


def test_compare_probes_both_configs_in_turn_and_gates_the_ratio(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from lbtune.cli import capacity as cli

    curves = {"rr": logistic(8.0, 0.99, width=0.4), "tuned": logistic(11.0, 0.99, width=0.4)}
    live = {"now": "rr"}
    applied: list[str] = []

    def applier(state_dir: Path | None, path: Path) -> Callable[[], None]:
        def apply() -> None:
            live["now"] = path.stem
            applied.append(path.stem)

        return apply

    def call(self: LiveProbe, rate: float) -> ProbeResult:
        self.probes.next(rate)
        return CurveProbe(curves[live["now"]], n=5000)(rate)

    monkeypatch.setattr(cli, "_applier", applier)
    monkeypatch.setattr(cli, "_config_restorer", lambda state_dir: lambda: applied.append("x"))
    monkeypatch.setattr(LiveProbe, "__call__", call)
    a, b = tmp_path / "rr.yaml", tmp_path / "tuned.yaml"
    args = ["--slo", "ttft=1s", "--no-twin", "--out", str(tmp_path / "cmp")]
    assert _main(monkeypatch, *args, "--compare", str(a), str(b), "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert applied[:4] == ["rr", "tuned", "rr", "tuned"] and applied[-1] == "x"
    assert [s["label"] for s in out["sides"]] == ["A:rr", "B:tuned"]
    lo, hi = out["ratio"]["ci"]
    assert lo > 1.0 and lo <= 11 / 8 <= hi and out["failed"] is None
    gate = ["--fail-on", "capacity=-5%"]
    assert _main(monkeypatch, *args, "--compare", str(b), str(a), *gate) == 1
    assert "FAILED: capacity fell to 7" in capsys.readouterr().out


def test_the_readme_and_docs_examples_parse() -> None:
    """Every `lbtune capacity ...` line of README.md and docs/capacity.md names options the
    command has (parsed by click, nothing run)."""
    import shlex

    import typer.main

    from lbtune.cli import app

    group = typer.main.get_command(app)
    cmd = group.commands["capacity"]  # type: ignore[attr-defined]
    root = Path(__file__).resolve().parents[2]
    lines = [
        line.split("#")[0].strip()
        for doc in ("README.md", "docs/capacity.md")
        for line in (root / doc).read_text().splitlines()
        if line.strip().startswith("lbtune capacity ")
    ]
    assert len(lines) >= 6
    for line in lines:
        cmd.make_context("capacity", shlex.split(line)[2:])
