"""The embedded cluster for real: sim replicas, HAProxy and Prometheus on loopback.

One mini2 cluster (h100-0 serves the 8B and the 70B model, l4-0 only the 8B) serves
the module; the last test brings it down and checks that nothing is left running.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_api_client import PrometheusConnect
from typer.testing import CliRunner

from lbtune.cli import app
from lbtune.cluster import api, health
from lbtune.errors import ClusterError, DependencyError
from lbtune.process import supervisor
from lbtune.process.supervisor import ProcessRecord
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import StatePaths
from tests.cluster.conftest import M8, M70, alive, chat, mini_config, started_pids, stream_ttft

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_prometheus_sees_one_engine_series_per_replica(cluster: Endpoints) -> None:
    prom = PrometheusConnect(cluster.prometheus_url, disable_ssl=True)
    result = prom.custom_query("count(vllm:num_requests_running)")
    assert int(float(result[0]["value"][1])) == len(cluster.replicas) == 2
    series = prom.custom_query("vllm:num_requests_running")
    assert {(s["metric"]["replica"], s["metric"]["gpu"]) for s in series} == {
        ("h100-0", "h100-80g"),
        ("l4-0", "l4-24g"),
    }
    up = prom.custom_query('up{job="haproxy"}')
    assert up and up[0]["value"][1] == "1"


def test_the_70b_model_lands_only_on_the_h100(cluster: Endpoints) -> None:
    seen70 = {chat(cluster.balancer_url, M70).headers["X-Lbtune-Replica"] for _ in range(6)}
    seen8 = {chat(cluster.balancer_url, M8).headers["X-Lbtune-Replica"] for _ in range(4)}
    assert seen70 == {"h100-0"}
    assert seen8 == {"h100-0", "l4-0"}  # roundrobin over both 8B replicas


def test_an_unknown_model_gets_haproxys_json_404(cluster: Endpoints) -> None:
    resp = chat(cluster.balancer_url, "gpt-4o")
    assert resp.status_code == 404
    assert "X-Lbtune-Replica" not in resp.headers  # answered by HAProxy itself
    error = resp.json()["error"]
    assert error["code"] == "model_not_found" and M70 in error["message"]
    models = requests.get(f"{cluster.balancer_url}/v1/models", timeout=10)
    assert models.status_code == 200  # the union of the replicas' models, from HAProxy
    assert sorted(m["id"] for m in models.json()["data"]) == [M70, M8]
    health = requests.get(f"{cluster.balancer_url}/health", timeout=10)
    assert health.status_code == 200 and "X-Lbtune-Replica" in health.headers


def test_a_body_beyond_the_buffer_without_a_visible_model_gets_413(cluster: Endpoints) -> None:
    body = (
        '{"messages": [{"role": "user", "content": "' + "x " * 150_000 + f'"}}], "model": "{M8}"}}'
    )
    resp = requests.post(
        f"{cluster.balancer_url}/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"


def test_streaming_passes_chunk_by_chunk(cluster: Endpoints) -> None:
    """TTFT through HAProxy stays within a few ms of TTFT straight to the replica."""
    direct_url = next(r.url for r in cluster.replicas if r.name == "h100-0")
    stream_ttft(cluster.balancer_url, M70)  # warm-up
    direct, balanced, totals = [], [], []
    for _ in range(10):
        d, _total, _n = stream_ttft(direct_url, M70)
        b, total, n = stream_ttft(cluster.balancer_url, M70)
        direct.append(d)
        balanced.append(b)
        totals.append(total)
        assert n >= 20
    diff = statistics.median(balanced) - statistics.median(direct)
    med_d, med_b = statistics.median(direct) * 1e3, statistics.median(balanced) * 1e3
    print(f"TTFT median direct {med_d:.1f} ms, through HAProxy {med_b:.1f} ms")
    assert diff < 0.010, f"TTFT via HAProxy {diff * 1e3:.1f} ms slower than direct"
    # A buffered stream would arrive in one piece: first token == whole stream.
    assert statistics.median(totals) - statistics.median(balanced) > 0.02


def test_status_json_parses(cluster: Endpoints) -> None:
    result = CliRunner().invoke(
        app, ["cluster", "status", "--json", "--state-dir", cluster.state_dir]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["healthy"] is True and data["problems"] == []
    assert data["endpoints"]["balancer_url"] == cluster.balancer_url
    assert [r["healthy"] for r in data["replicas"]] == [True, True]
    assert all(r["running"] == 0 and r["healthy"] for r in data["replicas"])


def test_calibrate_measures_a_replica_and_says_where_the_rates_go(cluster: Endpoints) -> None:
    args = ["cluster", "calibrate", "--state-dir", cluster.state_dir, "--replica", "l4-0"]
    result = CliRunner().invoke(app, [*args, "--repeats", "1", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (l4,) = doc["replicas"]
    assert l4["name"] == "l4-0" and l4["model"] == M8 and l4["prefill_tokens_per_s"] > 0
    assert doc["time_scale"] == cluster.time_scale
    assert "runs no llm scheduler" in result.stderr  # mini2 balances round robin
    assert (Path(cluster.state_dir) / "calibration.json").exists()
    table = CliRunner().invoke(app, [*args, "--repeats", "1"])
    assert table.exit_code == 0 and "prefill tok/s" in table.stdout and "l4-0" in table.stdout


def test_up_again_is_idempotent_and_a_different_config_is_refused(cluster: Endpoints) -> None:
    before = started_pids(Path(cluster.state_dir))
    assert api.up(mini_config(), cluster.state_dir) == cluster
    assert started_pids(Path(cluster.state_dir)) == before
    with pytest.raises(ClusterError, match=r"different config .*`lbtune cluster down"):
        api.up(mini_config(time_scale=8.0), cluster.state_dir)


def test_down_leaves_nothing_running(cluster: Endpoints) -> None:
    state = Path(cluster.state_dir)
    pids = started_pids(state)
    assert len(pids) >= 4  # sim, prometheus, haproxy master + worker
    stopped = api.down(state)
    assert sorted(p for ps in stopped.values() for p in ps) == sorted(pids)
    assert not [p for p in pids if alive(p)]
    assert not list(state.glob("*.pid")) and not (state / "endpoints.json").exists()
    assert api.down(state) == {}
    assert api.status(state).running is False


# --- failures: one line, nothing left running ---------------------------------------


def test_a_busy_port_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = mini_config()
        cfg = cfg.model_copy(update={"ports": cfg.ports.model_copy(update={"prometheus": port})})
        with pytest.raises(ClusterError, match=f"Port {port} \\(prometheus\\) is already in use"):
            api.up(cfg, tmp_path / "s")
    assert not list((tmp_path / "s").glob("*.pid"))


def test_a_missing_binary_is_a_dependency_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # neither haproxy nor prometheus there
    with pytest.raises(DependencyError, match=r"`prometheus` not found .*apt-get install"):
        api.up(mini_config(), tmp_path / "s")
    assert not list((tmp_path / "s").glob("*.pid"))
    prometheus = shutil.which("prometheus", path=os.defpath + ":/usr/bin:/usr/local/bin")
    assert prometheus is not None
    (tmp_path / "prometheus").symlink_to(prometheus)  # now only the balancer is missing
    with pytest.raises(DependencyError, match=r"`haproxy` not found .*apt-get install haproxy"):
        api.up(mini_config(), tmp_path / "s")
    assert not list((tmp_path / "s").glob("*.pid"))  # the sim and Prometheus were stopped


def test_a_component_that_never_gets_ready_is_stopped_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(health, "prometheus_missing", lambda ep: "forced for the test")
    monkeypatch.setattr(api, "PROMETHEUS_TIMEOUT", 0.2)
    state = tmp_path / "s"
    seen: list[int] = []
    real_start = supervisor.start

    def spy(
        name: str, cmd: Sequence[str], paths: StatePaths, env: Any = None, cpus: Any = None
    ) -> ProcessRecord:
        rec = real_start(name, cmd, paths, env, cpus)
        seen.append(rec.pid)
        return rec

    monkeypatch.setattr(supervisor, "start", spy)
    with pytest.raises(ClusterError, match=r"Timed out .* Prometheus scrapes: forced for the test"):
        api.up(mini_config(), state)
    assert len(seen) == 3
    assert not [p for p in seen if alive(p)]
    assert not list(state.glob("*.pid"))
