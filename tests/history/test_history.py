"""History: the index in the studies database, drift, the CLI and the HTML page."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lbtune.cli import app
from lbtune.errors import ConfigError
from lbtune.history import ENV_DB, db_path
from lbtune.history.drift import bootstrap_p99_diff, check_drift, samples
from lbtune.history.page import page
from lbtune.history.store import SCHEMA_VERSION, Entry, HistoryStore, KeyFigures
from lbtune.loadgen.recordio import write_parquet
from lbtune.tune.optimize import record_study, run_optimize
from lbtune.tune.options import OptimizeOptions
from tests.metrics.records import rec
from tests.search.fakes import FakeMeasure, FakeTarget, harness


def _fig(p99: float, **kw: object) -> KeyFigures:
    base: dict[str, object] = dict(
        p99_e2e_s=p99,
        p50_ttft_s=0.05,
        p99_ttft_s=p99 / 10,
        requests_per_s=10.0,
        goodput_per_s=9.0,
        error_rate=0.0,
        degraded=False,
        completed=200,
    )
    base.update(kw)
    return KeyFigures(**base)  # type: ignore[arg-type]


def _study(t: float, base: KeyFigures, accepted: bool, verify: KeyFigures | None = None) -> Entry:
    figs = {"baseline": base} | ({"verification": verify} if verify else {})
    return Entry(
        kind="study",
        time=t,
        scenario="mixed",
        target="haproxy",
        study=f"s{t:g}",
        accepted=accepted,
        figures=figs,
        load={"duration_s": 25.0},
    )


def _stress(t: float, fig: KeyFigures) -> Entry:
    return Entry(
        kind="stress",
        time=t,
        scenario="mixed",
        target="http://127.0.0.1:8000",
        figures={"run": fig},
        load={"duration_s": 25.0},
    )


def _parquet(dir_: Path, e2e: np.ndarray) -> Path:
    sent = np.arange(e2e.size) * 0.05 + 1000.0
    records = [
        rec(i, sent=float(t), ttft=float(e) / 10, e2e=float(e))
        for i, (t, e) in enumerate(zip(sent, e2e, strict=True))
    ]
    write_parquet(records, dir_ / "requests.parquet")
    return dir_


def test_db_path_follows_the_study_storage_unless_overridden(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV_DB, raising=False)
    assert db_path("sqlite:///reports/studies.db") == Path("reports/studies.db")
    assert db_path("sqlite:////abs/x.db?timeout=5") == Path("/abs/x.db")
    assert db_path("sqlite:///:memory:") is None
    assert db_path("postgresql://db/optuna", Path("out")) == Path("out/studies.db")
    assert db_path(reports_root=Path("r")) == Path("r/studies.db")
    monkeypatch.setenv(ENV_DB, "/tmp/h.db")
    assert db_path("sqlite:///reports/studies.db") == Path("/tmp/h.db")


def test_add_entry_indexes_whatever_was_imported_before(tmp_path: Path) -> None:
    """The history.index submodule's import rebinds ``lbtune.history.index``: the function
    that adds an entry must not share that name (record_stress once called the module)."""
    import lbtune.history.index  # noqa: F401
    from lbtune import history

    history.add_entry(tmp_path / "h.db", lambda: _study(1.0, KeyFigures(), True), "a study")
    assert [e.study for e in HistoryStore(tmp_path / "h.db").entries()] == ["s1"]


def test_store_round_trips_and_keeps_optuna_tables_apart(tmp_path: Path) -> None:
    db = tmp_path / "studies.db"
    sqlite3.connect(db).execute("CREATE TABLE studies (study_id INTEGER)").connection.close()
    store = HistoryStore(db)
    e = store.add(_study(100.0, _fig(1.0), True, _fig(0.8, records_dir="/x")))
    store.add(_stress(200.0, _fig(0.9)))
    got = store.entries()
    assert [x.kind for x in got] == ["study", "stress"]  # oldest first
    assert got[0].id == e.id and got[0].accepted is True
    assert got[0].reference == _fig(0.8, records_dir="/x")
    assert got[1].current == _fig(0.9) and got[1].accepted is None
    assert [x.kind for x in store.entries(last=1)] == ["stress"]
    tables = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master")}
    assert {"studies", "lbtune_meta", "lbtune_runs", "lbtune_figures"} <= tables


def test_a_resumed_study_replaces_its_entry_and_keeps_its_first_time(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    store.add(_study(100.0, _fig(1.0), False))
    store.add(replace(_study(300.0, _fig(1.5), False), study="s100"))
    (only,) = store.entries()
    assert only.time == 100.0 and only.current is not None and only.current.p99_e2e_s == 1.5


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    store.add(_stress(1.0, _fig(1.0)))
    with sqlite3.connect(tmp_path / "h.db") as c:
        c.execute(
            "UPDATE lbtune_meta SET value = ? WHERE key = 'schema_version'",
            (str(SCHEMA_VERSION + 1),),
        )
    with pytest.raises(ConfigError, match="schema version"):
        store.entries()
    with pytest.raises(ConfigError, match="no database"):
        HistoryStore(tmp_path / "none.db").entries()


def test_drift_needs_an_accepted_reference() -> None:
    d = check_drift([_study(1, _fig(1.0), False), _stress(2, _fig(9.0))], "mixed")
    assert not d.drift and d.reference is None and "nothing to drift from" in d.notes[0]


def test_drift_is_flagged_beyond_the_threshold_without_records() -> None:
    entries = [_study(1, _fig(1.0), True, _fig(1.0)), _stress(2, _fig(1.1)), _stress(3, _fig(1.3))]
    d = check_drift(entries, "mixed")
    assert d.drift and d.drifted == ["p99_e2e_s", "p99_ttft_s"]
    assert d.current is entries[2] and d.reference is entries[0]
    assert not check_drift(entries[:2], "mixed").drift  # +10 % is within 20 %
    errs = check_drift([entries[0], _stress(2, _fig(1.0, error_rate=0.05))], "mixed")
    assert errs.drifted == ["error_rate"]
    slow = check_drift([entries[0], _stress(2, _fig(1.0, goodput_per_s=5.0))], "mixed")
    assert slow.drifted == ["goodput_per_s"]


def test_drift_with_records_needs_the_bootstrap_ci_above_zero(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ref_dir = _parquet(tmp_path / "ref", rng.lognormal(0, 0.3, 400))
    same_dir = _parquet(tmp_path / "same", rng.lognormal(0, 0.3, 400))
    worse_dir = _parquet(tmp_path / "worse", 2 * rng.lognormal(0, 0.3, 400))
    ref = KeyFigures(p99_e2e_s=1.0, records_dir=str(ref_dir))
    accepted = _study(1, _fig(1.0), True, ref)
    # The stored figure says +50 %, but the records of the two runs are alike: noise.
    noisy = _stress(2, KeyFigures(p99_e2e_s=1.5, records_dir=str(same_dir)))
    d = check_drift([accepted, noisy], "mixed")
    (p99,) = [c for c in d.checks if c.name == "p99_e2e_s"]
    assert p99.beyond and p99.ci is not None and p99.ci[0] <= 0 and not p99.drifted
    worse = _stress(3, KeyFigures(p99_e2e_s=2.0, records_dir=str(worse_dir)))
    d = check_drift([accepted, noisy, worse], "mixed")
    assert d.drift and d.checks[0].ci is not None and d.checks[0].ci[0] > 0


def test_samples_keep_the_window_and_successes(tmp_path: Path) -> None:
    d = _parquet(tmp_path / "r", np.full(100, 0.5))  # sent every 50 ms: 5 s
    all_ = samples(KeyFigures(records_dir=str(d)), "e2e")
    part = samples(KeyFigures(records_dir=str(d), window_start_s=1.0, window_end_s=2.0), "ttft")
    assert all_ is not None and all_.size == 100
    assert part is not None and part.size == 20 and np.allclose(part, 0.05)
    assert samples(KeyFigures(records_dir=str(tmp_path / "gone")), "e2e") is None


def test_samples_use_the_window_run_json_recorded(tmp_path: Path) -> None:
    """Not offsets from the first send: the absolute window of the run's plan."""
    from lbtune.run.plan import plan_run
    from lbtune.run.stress import StressOptions
    from lbtune.scenario.runplan import write_run_plan

    d = _parquet(tmp_path / "r", np.full(100, 0.5))  # sent 1000.00 .. 1004.95
    plan = plan_run(StressOptions(scenario="chat", duration_s=30))
    write_run_plan(d, plan.as_run(999.0, (1002.0, 1004.0)))
    # The entry's offsets (1 .. 2 s after the first send) would give 20 requests.
    part = samples(KeyFigures(records_dir=str(d), window_start_s=1.0, window_end_s=2.0), "e2e")
    assert part is not None and part.size == 40


def test_ttft_samples_are_the_streamed_ones(tmp_path: Path) -> None:
    """As in the summary's latency table: a non-streamed response has no TTFT (not its E2E)."""
    d = tmp_path / "r"
    streamed = [rec(i, sent=1000.0 + i, ttft=0.1, e2e=1.0) for i in range(5)]
    whole = [
        replace(rec(10 + i, sent=1010.0 + i, ttft=None, e2e=3.0), stream=False) for i in range(5)
    ]
    write_parquet(streamed + whole, d / "requests.parquet")
    ttft = samples(KeyFigures(records_dir=str(d)), "ttft")
    e2e = samples(KeyFigures(records_dir=str(d)), "e2e")
    assert ttft is not None and ttft.size == 5 and np.allclose(ttft, 0.1)
    assert e2e is not None and e2e.size == 10


def test_bootstrap_p99_diff_is_the_linear_p99() -> None:
    a = np.arange(1.0, 101.0)  # linear P99 at h = 98.01: 99.01
    diff, _lo, _hi = bootstrap_p99_diff(a, np.zeros(100), n_boot=100)
    assert diff == pytest.approx(99.01)


def test_bootstrap_p99_ci_brackets_the_difference() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.lognormal(0, 0.3, 500), rng.lognormal(0, 0.3, 500)
    diff, lo, hi = bootstrap_p99_diff(a, b, n_boot=500)
    assert lo <= diff <= hi and lo < 0 < hi


def test_studies_are_indexed_by_record_study_and_drift_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_DB, str(tmp_path / "h.db"))
    target = FakeTarget()
    target.live = {**target.live, "x": 1.0}  # bad live config: a winner will be accepted

    def study(name: str) -> None:
        opts = OptimizeOptions(
            budget=8,
            study=name,
            storage=f"sqlite:///{tmp_path}/s.db",
            out_dir=tmp_path / name,
            seed=3,
            confirm_runs=2,
        )
        run_optimize(opts, harness=harness(target, FakeMeasure(target)), on_result=record_study)

    study("first")
    (e,) = HistoryStore(tmp_path / "h.db").entries()
    assert e.kind == "study" and e.study == "first" and e.accepted
    assert set(e.figures) == {"baseline", "winner", "verification"}
    assert e.figures["baseline"].records_dir == str(tmp_path / "first/runs/trial-0000")
    assert e.params == dict(target.live) and e.config_hash
    target.live = {**target.live, "x": 1.0}  # tonight the live config went bad again
    study("second")
    entries = HistoryStore(tmp_path / "h.db").entries()
    assert [x.study for x in entries] == ["first", "second"]
    d = check_drift(entries, entries[0].scenario)
    assert d.drift and "p99_e2e_s" in d.drifted and d.reference is not None
    assert d.reference.study == "first"


def test_an_unwritable_index_warns_and_the_study_still_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "dir.db").mkdir()
    monkeypatch.setenv(ENV_DB, str(tmp_path / "dir.db"))
    target = FakeTarget()
    opts = OptimizeOptions(
        budget=4,
        study="w",
        storage=f"sqlite:///{tmp_path}/s.db",
        out_dir=tmp_path / "w",
        seed=1,
        confirm_runs=0,
    )
    res = run_optimize(opts, harness=harness(target, FakeMeasure(target)), on_result=record_study)
    assert res.study == "w"
    assert any("not indexed" in r.getMessage() for r in caplog.records)


def test_cli_table_json_html_and_check_drift(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    store = HistoryStore(db)
    store.add(_study(1_700_000_000, _fig(1.0), True, _fig(1.0)))
    store.add(_stress(1_700_086_400, _fig(1.05)))
    runner = CliRunner()
    r = runner.invoke(app, ["history", "--storage", str(db)])
    assert r.exit_code == 0, r.output
    assert "study" in r.output and "stress" in r.output and "1050" in r.output
    r = runner.invoke(
        app,
        [
            "history",
            "--storage",
            f"sqlite:///{db}",
            "--json",
            "--check-drift",
            "--html",
            str(tmp_path / "h.html"),
        ],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert len(doc["entries"]) == 2 and doc["drift_detected"] is False
    assert doc["drift"][0]["reference"]["kind"] == "study"
    text = (tmp_path / "h.html").read_text()
    assert "data:image/png;base64," in text and "No drift" in text
    assert "http://" not in text.replace("http://127.0.0.1:8000", "")  # self-contained
    store.add(_stress(1_700_172_800, _fig(2.0)))
    r = runner.invoke(app, ["history", "--storage", str(db), "--check-drift", "-s", "mixed"])
    assert r.exit_code == 1 and "DRIFT" in r.output
    r = runner.invoke(app, ["history", "--storage", str(tmp_path / "none.db")])
    assert r.exit_code == 2 or isinstance(r.exception, ConfigError)


def test_page_renders_without_any_entry() -> None:
    assert "lbtune history" in page([])
