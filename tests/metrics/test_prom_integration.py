"""A real Prometheus server scraping fixed metrics; collect() reads them back.

The scrape target is a tiny ``http.server`` thread in this test serving vLLM-,
DCGM-, HAProxy- and lbtune-named metrics in the text format. A fake *target* is
what this test needs: the values must be known exactly (counters growing by a
fixed amount per scrape, so ratios and histogram quantiles are exact whatever
Prometheus' extrapolation does), which the simulator's live metrics are not. The
Prometheus server, its scraping, its storage and its PromQL engine are the real
ones; the embedded cluster's own tests cover the real replicas.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from lbtune.cluster.resolve import free_port as _free_port
from lbtune.errors import TargetError
from lbtune.metrics.prom import PromClient
from lbtune.metrics.serverside import collect
from lbtune.metrics.summary import Window
from lbtune.targets.haproxy.balancer import SERIES as HAPROXY

pytestmark = pytest.mark.integration

SCRAPE_S = 0.25
REPLICAS = {
    "r0": {"running": 3, "kv": 0.5, "hits": 2, "gpu": 80, "sm": 0.6},
    "r1": {"running": 1, "kv": 0.25, "hits": 1, "gpu": 20, "sm": 0.2},
}


def _replica_metrics(name: str, k: int) -> str:
    r = REPLICAS[name]
    # Per scrape: 4 prefix queries, r["hits"] hits, 1 preemption, 10 TTFTs of which
    # 5 <= 50 ms, 9 <= 100 ms, 10 <= 250 ms.
    buckets = {"0.05": 5, "0.1": 9, "0.25": 10, "+Inf": 10}
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{model_name="m"}} {r["running"]}',
        f'vllm:num_requests_waiting{{model_name="m"}} {r["running"] - 1}',
        f'vllm:kv_cache_usage_perc{{model_name="m"}} {r["kv"]}',
        "# TYPE vllm:prefix_cache_queries_total counter",
        f'vllm:prefix_cache_queries_total{{model_name="m"}} {4 * k}',
        "# TYPE vllm:prefix_cache_hits_total counter",
        f'vllm:prefix_cache_hits_total{{model_name="m"}} {r["hits"] * k}',
        "# TYPE vllm:num_preemptions_total counter",
        f'vllm:num_preemptions_total{{model_name="m"}} {k}',
        "# TYPE vllm:time_to_first_token_seconds histogram",
        *(
            f'vllm:time_to_first_token_seconds_bucket{{model_name="m",le="{le}"}} {n * k}'
            for le, n in buckets.items()
        ),
        f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {0.6 * k}',
        f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {10 * k}',
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0"}} {r["gpu"]}',
        "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge",
        f'DCGM_FI_PROF_SM_ACTIVE{{gpu="0"}} {r["sm"]}',
    ]
    return "\n".join(lines) + "\n"


def _haproxy_metrics(k: int) -> str:
    return (
        'haproxy_backend_current_queue{proxy="llm"} 2\n'
        'haproxy_server_current_sessions{proxy="llm",server="r0"} 4\n'
        'haproxy_server_current_sessions{proxy="llm",server="r1"} 1\n'
        "# TYPE haproxy_server_http_responses_total counter\n"
        f'haproxy_server_http_responses_total{{proxy="llm",server="r0",code="2xx"}} {10 * k}\n'
    )


def _lbtune_metrics(k: int) -> str:
    buckets = {"0.025": 0, "0.05": 5, "0.1": 9, "0.25": 10, "+Inf": 10}
    return (
        "# TYPE lbtune_requests_total counter\n"
        f'lbtune_requests_total{{outcome="ok",replica="r0"}} {10 * k}\n'
        f'lbtune_requests_total{{outcome="timeout",replica="r1"}} {k}\n'
        "# TYPE lbtune_ttft_seconds histogram\n"
        + "".join(f'lbtune_ttft_seconds_bucket{{le="{le}"}} {n * k}\n' for le, n in buckets.items())
        + f"lbtune_ttft_seconds_sum {0.6 * k}\nlbtune_ttft_seconds_count {10 * k}\n"
        + "# TYPE lbtune_output_tokens_total counter\n"
        + f"lbtune_output_tokens_total {100 * k}\n"
    )


class _Target(BaseHTTPRequestHandler):
    scrapes: ClassVar[Counter[str]] = Counter()

    def do_GET(self) -> None:
        self.scrapes[self.path] += 1
        k = self.scrapes[self.path]
        name = self.path.strip("/").split("/")[0]
        if name in REPLICAS:
            body = _replica_metrics(name, k)
        elif name == "haproxy":
            body = _haproxy_metrics(k)
        else:
            body = _lbtune_metrics(k)
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        return


def _get_json(url: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(url, timeout=2) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def _wait(cond: object, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (Debian package `prometheus`)")
    target = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    tport = target.server_address[1]
    tmp: Path = tmp_path_factory.mktemp("prom")
    jobs = [(f"vllm-{r}", f"/{r}/metrics", {"replica": r}) for r in REPLICAS]
    jobs += [("haproxy", "/haproxy/metrics", {}), ("lbtune", "/lbtune/metrics", {})]
    config = {
        "global": {"scrape_interval": "250ms", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": job,
                "metrics_path": path,
                "static_configs": [{"targets": [f"127.0.0.1:{tport}"], "labels": labels}],
            }
            for job, path, labels in jobs
        ],
    }
    (tmp / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait(lambda: urllib.request.urlopen(f"{url}/-/ready", timeout=1).status == 200, "ready")

        def targets_up() -> bool:
            active = _get_json(f"{url}/api/v1/targets")["data"]["activeTargets"]
            return len(active) == len(jobs) and all(t["health"] == "up" for t in active)

        _wait(targets_up, "all targets up")
        query = "min(count_over_time(vllm:num_requests_running[10s]))"

        def enough_samples() -> bool:
            result = PromClient(url).query(query)
            return bool(result) and (result[0].value or 0) >= 8

        _wait(enough_samples, "8 samples of every replica")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
        target.shutdown()


def test_collect_reads_known_values(prometheus_url: str) -> None:
    prom = PromClient(prometheus_url)
    prom.check()
    now = time.time()
    side = collect(prom, Window(now - 1.5, now), scrape_interval_s=SCRAPE_S, balancer=HAPROXY)
    assert not side.incomplete and side.missing == (), side.notes
    r = {x.replica: x for x in side.replicas}
    assert sorted(r) == ["r0", "r1"]
    assert r["r0"].running_avg == pytest.approx(3.0) and r["r1"].running_max == pytest.approx(1.0)
    assert r["r0"].waiting_avg == pytest.approx(2.0)
    assert r["r0"].kv_usage_max == pytest.approx(0.5)
    # Hits/queries grow 2:4 on r0 and 1:4 on r1, scraped together: exact ratios.
    assert r["r0"].prefix_cache_hit_rate == pytest.approx(0.5)
    assert r["r1"].prefix_cache_hit_rate == pytest.approx(0.25)
    # (2a + b) / (4a + 4b): exact only when both replicas saw as many scrapes (a = b).
    assert side.prefix_cache_hit_rate == pytest.approx(0.375, abs=0.03)
    assert (r["r0"].preemptions or 0) > 0
    # TTFT buckets 5/9/10 of 10: P50 = 0.05 (rank 5 at the top of the first bucket),
    # P99 = 0.1 + (0.25 - 0.1) * (9.9 - 9) / (10 - 9) = 0.235.
    assert r["r0"].server_ttft_p50 == pytest.approx(0.05)
    assert r["r1"].server_ttft_p99 == pytest.approx(0.235)
    assert r["r0"].gpu_util == pytest.approx(0.8) and r["r1"].busy_fraction == pytest.approx(0.2)
    assert r["r0"].sm_active == pytest.approx(0.6) and r["r1"].sm_active == pytest.approx(0.2)
    assert side.replica_balance == pytest.approx(0.2) and side.balance_source == "sm_active"
    assert side.balancer is not None and side.balancer.name == "haproxy"
    assert side.balancer.queues[0].pool == "llm" and side.balancer.queues[0].avg == 2.0
    servers = {s.server: s for s in side.balancer.servers}
    assert servers["r0"].sessions_max == 4.0 and servers["r0"].responses["2xx"] > 0
    assert side.client is not None
    assert side.client.ttft_buckets == (0.025, 0.05, 0.1, 0.25)
    # Rank 5 of 10 lies at the top of (0.025, 0.05]: the estimate is its upper bound.
    assert side.client.ttft_p50 == pytest.approx(0.05)
    ok, timeout = side.client.requests_by_outcome["ok"], side.client.requests_by_outcome["timeout"]
    assert ok == pytest.approx(10 * timeout)


def test_query_error_names_the_promql(prometheus_url: str) -> None:
    with pytest.raises(TargetError, match=r"query failed .*: sum by \(\(broken"):
        PromClient(prometheus_url).query("sum by ((broken")


def test_unreachable_prometheus_fails_fast() -> None:
    port = _free_port()  # nothing listens there
    t = time.monotonic()
    with pytest.raises(TargetError, match=r"unreachable .*lbtune cluster up.*--prometheus URL"):
        PromClient(f"http://127.0.0.1:{port}").check()
    assert time.monotonic() - t < 5
    side = collect(PromClient(f"http://127.0.0.1:{port}"), Window(1.0, 31.0))
    assert side.incomplete and side.replicas == () and side.client is None
    assert side.notes[0].startswith("Prometheus unreachable after 0 s (0 of ")


def test_silent_prometheus_times_out_within_budget() -> None:
    # Accepts connections (the kernel's backlog does) but never answers.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        t = time.monotonic()
        with pytest.raises(TargetError, match="unreachable"):
            PromClient(url, timeout_s=1.0).check()
        assert time.monotonic() - t < 1.5
