"""`lbtune stress` end to end on a real mini2 cluster (sim + HAProxy + Prometheus + Locust).

One short run is shared by several assertions (each a test) to keep the suite fast:
the JSON contract, the report files, outcome accounting against the replicas'
own counters, and that the API key never leaks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import running_cluster
from tests.robustness.conftest import wait_for_stop

pytestmark = pytest.mark.integration

SECRET = "sk-test-do-not-leak-5f3a"


def _success_total(replica_url: str) -> float:
    """Sum of vllm:request_success_total over every label set of one replica."""
    text = requests.get(f"{replica_url}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{")
    )


def _lbtune(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lbtune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_cluster(tmp_path_factory.mktemp("stress-cluster"), time_scale=8.0) as ep:
        yield ep


@pytest.fixture(scope="module")
def run(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 14 s chat run through the CLI with an API key in the environment."""
    out = tmp_path_factory.mktemp("stress-report")
    before = {r.name: _success_total(r.url) for r in cluster.replicas}
    proc = _lbtune(
        "stress",
        "--scenario",
        "chat",
        "--duration",
        "14",
        "--users",
        "6",
        "--state-dir",
        str(cluster.state_dir),
        "--out",
        str(out),
        "--json",
        env={"LBTUNE_API_KEY": SECRET},
    )
    assert proc.returncode == 0, proc.stderr
    after = {r.name: _success_total(r.url) for r in cluster.replicas}
    return {"proc": proc, "out": out, "before": before, "after": after}


def test_json_output_holds_every_figure(run: dict[str, Any]) -> None:
    summary = json.loads(run["proc"].stdout)
    lat = summary["latency"]
    for name in ("ttft", "itl", "tpot", "e2e"):
        assert lat[name]["count"] > 0
        assert lat[name]["p50"] is not None
    thr = summary["throughput"]
    assert thr["requests_per_s"] > 0 and thr["output_tokens_per_s"] > 0
    assert summary["outcomes"]["sent"] == sum(summary["outcomes"]["counts"].values())
    assert {r["replica"] for r in summary["replicas"]} == {"h100-0", "l4-0"}
    assert summary["server"] is not None and summary["server"]["replicas"]
    # The balancer's own section, from the series its registry entry names (HAProxy here).
    lb = summary["server"]["balancer"]
    assert lb["name"] == "haproxy" and lb["queues"], lb
    servers = {s["server"]: s for s in lb["servers"]}
    assert set(servers) == {"h100-0", "l4-0"}
    assert sum(s["responses"].get("2xx", 0) for s in servers.values()) > 0
    assert summary["generator"]["processes"] >= 1
    assert "throughput_decay" in summary and "slo_checks" in summary


def test_report_directory(run: dict[str, Any]) -> None:
    out: Path = run["out"]
    for name in ("summary.json", "requests.parquet", "report.md", "report.html"):
        assert (out / name).stat().st_size > 0, name
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 4


def test_every_request_sent_is_counted_once_and_matches_the_servers(run: dict[str, Any]) -> None:
    from lbtune.loadgen.recordio import read_records

    records = read_records(run["out"] / "requests.parquet")
    ids = [r.request_id for r in records]
    assert len(ids) == len(set(ids)), "a request was recorded twice"
    summary = json.loads(run["proc"].stdout)
    assert summary["all_outcomes"]["sent"] == len(records)
    served = sum(run["after"].values()) - sum(run["before"].values())
    reached_a_replica = sum(1 for r in records if r.status_code == 200)
    assert served == reached_a_replica


def test_api_key_never_reaches_reports_logs_or_metrics(run: dict[str, Any], cluster: Any) -> None:
    for path in [*run["out"].rglob("*"), *Path(cluster.state_dir).rglob("*.log")]:
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in run["proc"].stdout + run["proc"].stderr
    series = requests.get(
        f"{cluster.prometheus_url}/api/v1/series",
        params={"match[]": '{job="lbtune"}'},
        timeout=5,
    ).json()["data"]
    assert series, "the client-side exporter was not scraped"
    assert SECRET not in json.dumps(series)


def test_ctrl_c_stops_cleanly_and_writes_a_partial_report(cluster: Any, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lbtune",
            "stress",
            "--scenario",
            "chat",
            "--duration",
            "120",  # ignoring Ctrl-C would keep it running past STOP_S
            "--users",
            "4",
            "--state-dir",
            str(cluster.state_dir),
            "--out",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not list(tmp_path.glob("records-*.jsonl")):
        time.sleep(0.2)
    time.sleep(3)  # let some requests complete so the partial report has content
    proc.send_signal(signal.SIGINT)
    # The generators stop within the drain bound, then the partial report is written (left
    # running, the run would hold the cluster's exporter port and fail the next tests).
    err = wait_for_stop(proc, str(tmp_path))
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["incomplete"] is True
    assert summary["all_outcomes"]["sent"] > 0
    assert (tmp_path / "report.html").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--target", "http://example.invalid:8000"], "--allow-remote"),
        (["--scenario", "no-such-scenario"], "no-such-scenario"),
        (["--slo", "ttft=fast"], "--slo"),
        (["--max-duration", "60"], "--max-duration"),
        (["--until-samples", "0"], "--until-samples"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    proc = _lbtune("stress", "--duration", "5", *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]


def test_unreachable_target_fails_within_5_s(tmp_path: Path) -> None:
    from lbtune.cluster.resolve import free_port

    port = free_port()  # nothing listens there (under xdist: in this worker's own range)
    began = time.monotonic()
    proc = _lbtune(
        "stress", "--target", f"http://127.0.0.1:{port}", "--duration", "5", "--out", str(tmp_path)
    )
    assert time.monotonic() - began < 5 + 3  # interpreter start-up on a loaded machine
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "unreachable" in proc.stderr
    assert "Traceback" not in proc.stderr


BUILTINS = ["chat", "longctx", "prefix", "mixed", "surge", "ramp", "agent"]


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_scenario_runs_briefly(cluster: Any, name: str, tmp_path: Path) -> None:
    from lbtune.run.stress import StressOptions, run_stress

    result = run_stress(
        StressOptions(
            scenario=name,
            duration_s=3,  # runs, answers, no errors: the drain lets what was sent finish
            state_dir=Path(cluster.state_dir),
            out_dir=tmp_path,
            write_report=False,
        )
    )
    counts = result.summary.all_outcomes.counts
    assert counts["ok"] > 0, counts
    errors = {k: v for k, v in counts.items() if k not in ("ok", "cancelled") and v}
    assert not errors, errors
    sessions = result.summary.sessions
    assert (sessions is not None) == (name == "agent")  # the session view: agent runs only
    if sessions is not None:  # 3 s: a session (3-8 calls, ~0.7 s tool delays) may not end
        assert sessions.failed == 0 and sessions.started >= sessions.completed, sessions


@pytest.mark.skipif(
    os.environ.get("LBTUNE_SKIP_BROWSER") == "1",
    reason="LBTUNE_SKIP_BROWSER=1: no headless Chromium (scripts/setup.sh skipped it)",
)
def test_report_html_renders_its_plots_in_headless_chromium(
    run: dict[str, Any], tmp_path: Path
) -> None:
    import shutil

    import matplotlib.image

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium is installed by scripts/setup.sh"
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            "--window-size=1280,1600",
            (run["out"] / "report.html").as_uri(),
        ],
        capture_output=True,
        timeout=90,
        check=True,
    )
    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[0] >= 1600 and pixels.shape[1] >= 1280
    # A rendered page with plots has many distinct colours; a blank page has one.
    rgb = (pixels[..., :3] * 255).astype("uint8").reshape(-1, 3)
    assert len({tuple(p) for p in rgb[:: max(1, len(rgb) // 20000)]}) > 50
