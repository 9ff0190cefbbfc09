"""With stdout/stderr piped (CI, ``| tee``) the commands still say something every few seconds."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lbtune.cli.stress import format_progress as stress_line
from lbtune.cli.study_view import format_progress as study_line
from lbtune.cli.ticker import EVERY_S, plain, ticking
from lbtune.loadgen.collect import Progress
from lbtune.tune.options import StudyProgress
from tests.conftest import running_cluster

# Not streamed: the test is about the progress lines, not TTFTs (whose timing bound a busy
# machine most often cannot hold, failing the trials whose lines it waits for).
SCENARIO = """\
name: quick
description: a short chat load for the piped-progress test
seed: 5
duration_s: 12
warmup_s: 1
cooldown_s: 1
slo: {ttft: 1s, e2e: 10s}
load: {type: constant, users: 8}
api: chat
models: {llama-3.1-8b-instruct: 1}
prompt_tokens: {type: lognormal, median: 150, sigma: 0.8, min: 8, max: 2048}
output_tokens: {type: lognormal, median: 60, sigma: 0.5, min: 16, max: 256}
stream: false
"""

MAX_GAP_S = 10.0
"""What the issue asks of the output: a reader of the log never waits longer for a line."""


def _progress(elapsed: float, remaining: float, in_flight: int) -> Progress:
    return Progress(
        elapsed_s=elapsed,
        remaining_s=remaining,
        sent=40,
        completed=40 - in_flight,
        requests_per_s=3.0,
        output_tokens_per_s=90.0,
        ttft_p50_s=0.02,
        ttft_p99_s=0.05,
        errors=0,
        in_flight=in_flight,
        generator_lag_p99_s=None,
        generator_cpu_percent=None,
    )


def test_stress_line_counts_down_then_says_draining() -> None:
    assert stress_line(_progress(12.0, 18.0, 5)).startswith("   12/30 s |")
    late = stress_line(_progress(34.0, 0.0, 7))
    assert "draining 7 requests" in late and "34/34" not in late


def test_study_line_names_the_trial_once() -> None:
    p = StudyProgress(study="s", phase="trial", budget=5, trial=0, role="live")
    text = plain(study_line(p, time.monotonic()))
    assert text.startswith("trial 0 (live) | 0/5 done") and "trial trial" not in text
    p.phase = "confirmation round 1: A (trial 0)"
    assert plain(study_line(p, time.monotonic())).startswith("confirmation round 1: A (trial 0) |")


def test_study_line_signs_the_change_as_study_json_does() -> None:
    """A score 90 % lower than the baseline's is "-90.0 %" (``improvement_vs_baseline``
    is ``best/baseline - 1``), not "+90.0 %"."""
    p = StudyProgress(study="s", phase="trial", budget=5, trial=3, role="sampled")
    p.best, p.best_trial, p.baseline = 0.1, 3, 1.0
    text = plain(study_line(p, time.monotonic()))
    assert "score -90.0% vs baseline" in text and "+90" not in text


def test_confirmation_shows_no_score_of_the_last_search_trial() -> None:
    from lbtune.tune.optimize import _Progress

    shown: list[str] = []
    show = _Progress(StudyProgress(study="s", budget=5), None, shown.append)
    show.prog.phase, show.prog.trial, show.prog.last_value = "trial", 4, 0.734
    assert "score so far 0.734" in plain(study_line(show.prog, time.monotonic()))
    show.phase("confirmation round 1: A (trial 0)")
    text = plain(study_line(show.prog, time.monotonic()))
    assert text.startswith("confirmation round 1") and "score so far" not in text


def test_ticking_emits_plain_lines_and_stops_with_the_block() -> None:
    got: list[str] = []
    with ticking(lambda: "[bold]trial 3[/] (sampled)\nbest -", got.append, True, every_s=0.01):
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    n = len(got)
    time.sleep(0.05)
    assert n >= 2 and len(got) == n  # no line after the block ended
    assert got[0] == "progress trial 3 (sampled) | best -"
    assert EVERY_S < MAX_GAP_S


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_piped_optimize_prints_a_line_at_least_every_10_s(tmp_path: Path) -> None:
    scenario = tmp_path / "quick.yaml"
    scenario.write_text(SCENARIO)
    state = tmp_path / "state"
    cmd = [
        sys.executable,
        "-m",
        "lbtune",
        "optimize",
        "--budget",
        "2",
        "--scenario",
        str(scenario),
        "--trial-duration",
        "12",
        "--confirm-runs",
        "0",
        "--screen",
        "8",  # the twin's stage is in the piped output too; 100 configs would cost a minute
        "--no-apply",
        "--study",
        "piped",
        "--storage",
        f"sqlite:///{tmp_path / 'studies.db'}",
        "--state-dir",
        str(state),
        "--out",
        str(tmp_path / "report"),
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("LBTUNE_CI", None)
    arrivals: list[tuple[float, str]] = []
    with running_cluster(state):
        child = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert child.stdout is not None
        out = child.stdout

        def read() -> None:
            for raw in out:
                arrivals.append((time.monotonic(), raw.rstrip("\n")))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            rc = child.wait(timeout=240)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=10)
        ended = time.monotonic()
        reader.join(timeout=10)
    text = "\n".join(line for _, line in arrivals)
    assert rc == 0, text[-3000:]
    study_at = next(t for t, line in arrivals if line.startswith("study piped:"))
    times = [t for t, _ in arrivals if t >= study_at] + [ended]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) <= MAX_GAP_S, f"gaps {[round(g, 1) for g in gaps]}\n{text[-3000:]}"
    ticks = [line for _, line in arrivals if " progress " in line]
    assert any("progress trial 0 (live) |" in line for line in ticks), text[-3000:]
    assert any("progress trial 1 (" in line for line in ticks), text[-3000:]
    assert "trial trial" not in text
