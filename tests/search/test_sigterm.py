"""Issue 29, class 3: SIGTERM to ``lbtune optimize`` (what CI runners and systemd send)
stops the study like Ctrl-C: the running trial ends, the last known good is restored, the
partial report is written, and the command exits 143.

The CLI runs in this process with the study over the fakes (``run_optimize`` keeps its
real loop; only the target and the measurement are fakes); the measurement of trial 3
sends SIGTERM to this very process.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import lbtune.tune.optimize as optimize_module
from lbtune.search.result import StudyResult
from lbtune.search.trial import Measurement, WindowHook
from lbtune.tune.options import OptimizeOptions
from tests.search.fakes import FakeMeasure, FakeTarget, harness, study_options


def test_sigterm_restores_the_last_known_good_and_writes_the_partial_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lbtune.cli import main

    real = optimize_module.run_optimize
    target = FakeTarget()
    inner = FakeMeasure(target)
    seen: dict[str, Any] = {}

    def measure(label: str, on_window: WindowHook | None = None) -> Measurement:
        if label == "trial-0003":
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in this (main) thread
        return inner(label, on_window)

    def fake_run(opts: OptimizeOptions, *, stop: threading.Event, **kw: Any) -> StudyResult:
        seen["out"] = opts.out_dir
        kw.pop("on_result", None)  # the history index of this machine stays as it is
        fake_opts = study_options(tmp_path, budget=12, out_dir=opts.out_dir)
        return real(fake_opts, harness=harness(target, measure), stop=stop, **kw)

    monkeypatch.setattr(optimize_module, "run_optimize", fake_run)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    out = tmp_path / "rep"
    argv = ["optimize", "--storage", f"sqlite:///{tmp_path}/cli.db", "--out", str(out), "--ci"]
    monkeypatch.setattr(sys, "argv", ["lbtune", *argv])
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    assert exited.value.code == 143, err
    assert "terminated (SIGTERM)" in err and "Traceback" not in err
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is put back
    assert seen["out"] == out
    assert target.live == target.lkg  # the last known good is what runs again
    study = json.loads((out / "study.json").read_text())
    assert study["interrupted"] is True
    assert len(study["trials"]) == 4  # trials 0-3: the study stopped at the signal
    assert any("SIGTERM" in note for note in study["notes"])
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
