"""``/metrics`` as lbtune reads it, checked against the simulator and real vLLM alike."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from http.client import HTTPConnection
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from lbtune.cluster.probing import parse_cache_info
from lbtune.metrics import promql
from tests.conformance.conftest import Metrics, Server
from tests.conformance.families import DCGM_GAUGES, INFO_GAUGES, VLLM_ONLY, VLLM_TYPES

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[2]
READERS = ["lbtune/metrics", "lbtune/agent", "lbtune/cluster", "dashboards"]
"""Where lbtune reads replica metrics: its PromQL, the agent, `cluster status`, dashboards."""

FINISHED_REASONS = {"stop", "length", "abort", "error", "repetition"}


def names_lbtune_reads() -> set[str]:
    """Every ``vllm:`` family named in lbtune's readers (``_bucket`` etc. stripped)."""
    found: set[str] = set()
    for where in READERS:
        for path in (ROOT / where).rglob("*"):
            if path.suffix in {".py", ".json", ".yml", ".yaml"} and path.is_file():
                found |= set(re.findall(r"vllm:[a-z0-9_]+", path.read_text(errors="replace")))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in found}


def _type_name(name: str, kind: str) -> str:
    """The ``# TYPE`` name: prometheus_client (vLLM) drops a counter's ``_total`` there."""
    return name.removesuffix("_total") if kind == "counter" else name


def _has_type(m: Metrics, name: str, kind: str) -> bool:
    return m.types.get(name) == kind or m.types.get(_type_name(name, kind)) == kind


def test_lbtune_reads_only_known_families() -> None:
    """The table below covers every vLLM name lbtune's code and dashboards read."""
    read = names_lbtune_reads()
    assert read, "found no vllm: names in lbtune's readers"
    known = set(VLLM_TYPES) | set(INFO_GAUGES) | set(VLLM_ONLY)
    assert read <= known, f"read but not checked here: {sorted(read - known)}"


def test_the_engine_histograms_twin_fit_reads_are_vllms_own(server: Server) -> None:
    """``twin fit`` reads prefill, decode and tokens-per-step histograms where a replica
    exports them: real vLLM does, with samples once it served a request; the simulator does
    not (the fit then keeps the rest of the engine's view: tests/cluster/test_steady.py)."""
    server.complete(max_tokens=2, ignore_eos=True)
    m = server.metrics()
    for name, kind in VLLM_ONLY.items():
        has = _has_type(m, name, kind) and bool(m.series(f"{name}_count"))
        assert has == (server.kind == "vllm"), name


def test_the_kv_cache_size_is_read_from_its_info_gauge(server: Server) -> None:
    """``lbtune twin fit`` reads the KV size from ``vllm:cache_config_info``: both servers
    export it with a block size and a block count it parses."""
    m = server.metrics()
    assert _has_type(m, "vllm:cache_config_info", "gauge")
    got = parse_cache_info(requests.get(server.url + "/metrics", timeout=10).text)
    assert got is not None and got[0] >= 1 and got[1] >= 1, got


def test_every_family_with_its_type_and_labels(server: Server) -> None:
    server.complete(max_tokens=2, ignore_eos=True)  # every histogram has a sample
    m = server.metrics()
    for name, kind in VLLM_TYPES.items():
        assert _has_type(m, name, kind), f"{name}: no # TYPE {kind}"
        sample = f"{name}_count" if kind == "histogram" else name
        series = m.series(sample)
        assert series, f"{name}: no samples"
        for labels in series:
            assert ("model_name", server.model) in labels, f"{name}: {sorted(labels)}"
            # lbtune groups by Prometheus' own target label `replica`: a server-written
            # one would be renamed exported_replica and break every `by (replica)`
            assert "replica" not in dict(labels), f"{name}: {sorted(labels)}"
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        # one engine per replica: `count(...)` is the number of replicas
        assert len(m.series(name)) == 1, name


def test_histograms_have_cumulative_buckets(server: Server) -> None:
    server.complete(max_tokens=2, ignore_eos=True)
    m = server.metrics()
    for name, kind in VLLM_TYPES.items():
        if kind != "histogram":
            continue
        buckets = sorted(
            ((float(dict(lab)["le"]), v) for lab, v in m.series(f"{name}_bucket").items()),
        )
        assert buckets and buckets[-1][0] == float("inf"), name
        counts = [v for _, v in buckets]
        assert counts == sorted(counts), f"{name}: buckets not cumulative"
        assert buckets[-1][1] == m.total(f"{name}_count"), name
        assert m.series(f"{name}_sum"), name


def test_success_has_every_finished_reason(server: Server) -> None:
    reasons = {
        dict(lab)["finished_reason"]
        for lab in server.metrics().series("vllm:request_success_total")
    }
    assert reasons == FINISHED_REASONS


def test_gpu_metrics_are_the_simulators_own(server: Server) -> None:
    """DCGM names are not vLLM's: on a GPU machine dcgm-exporter serves them beside vLLM.
    The sim writes them itself (it is the GPU); real vLLM on CPUs has none, and lbtune's
    report falls back to the busy fraction from ``vllm:num_requests_running``."""
    m = server.metrics()
    present = [n for n in DCGM_GAUGES if m.series(n)]
    assert present == (list(DCGM_GAUGES) if server.kind == "sim" else [])


def _success(server: Server) -> dict[str, float]:
    s = server.metrics().series("vllm:request_success_total")
    return {dict(lab)["finished_reason"]: v for lab, v in s.items()}


def _settle(server: Server) -> Metrics:
    """A scrape once the server runs and waits for nothing (bounded)."""
    for _ in range(200):
        m = server.metrics()
        busy = m.total("vllm:num_requests_running") + m.total("vllm:num_requests_waiting")
        if busy == 0:
            return m
        time.sleep(0.05)
    raise AssertionError("the server did not go idle within 10 s")


def test_success_counted_per_finished_reason(server: Server) -> None:
    """A finished request counts once under its reason; a refused one (404/400) and one
    whose client went away count nowhere — vLLM 0.32 counts no ``abort`` for a client
    disconnect, and the sim does the same."""
    _settle(server)
    before = _success(server)
    assert (
        server.complete(max_tokens=5, ignore_eos=True).json()["choices"][0]["finish_reason"]
        == "length"
    )
    server.complete(max_tokens=0)
    server.post("/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 1})
    _disconnect_mid_stream(server)
    _settle(server)
    after = _success(server)
    delta = {r: after[r] - before[r] for r in FINISHED_REASONS}
    assert delta == {"stop": 0, "length": 1, "abort": 0, "error": 0, "repetition": 0}


def _disconnect_mid_stream(server: Server) -> None:
    """Open a long stream, read its first chunk, close the connection."""
    u = urlsplit(server.url)
    conn = HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=30)
    body = json.dumps(
        {
            "model": server.model,
            "prompt": "x",
            "max_tokens": 3000,
            "ignore_eos": True,
            "stream": True,
        }
    )
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    resp.fp.readline()
    conn.close()


def test_lbtune_does_not_count_errors_or_aborts_as_finished() -> None:
    """lbtune's `requests_finished` must select the reasons that mean a served request."""
    query = promql.server_side_queries(60.0)["requests_finished"]
    for bad in ("error", "abort"):
        selects = f'finished_reason!~"{bad}' in query or (
            "finished_reason=~" in query and bad not in query.split("finished_reason=~")[1]
        )
        assert selects, f"{query!r} counts finished_reason={bad!r} as finished"


def test_prefix_cache_hits_move_with_a_shared_prefix(server: Server) -> None:
    """The same 512-token prompt twice: the second hits the cache for most of it (whole
    blocks); a prompt sharing nothing does not hit."""
    rng = random.Random(11)
    prompt = [rng.randrange(10, 4000) for _ in range(512)]
    other = [rng.randrange(10, 4000) for _ in range(512)]

    def counts() -> tuple[float, float]:
        m = _settle(server)
        return (m.total("vllm:prefix_cache_hits_total"), m.total("vllm:prefix_cache_queries_total"))

    server.complete(prompt, max_tokens=1)
    h0, q0 = counts()
    server.complete(prompt, max_tokens=1)
    h1, q1 = counts()
    assert q1 - q0 >= 512
    assert 256 <= h1 - h0 <= 512
    server.complete(other, max_tokens=1)
    h2, q2 = counts()
    assert q2 - q1 >= 512
    assert h2 - h1 < 256


def test_kv_usage_is_a_fraction_that_moves_under_load(server: Server) -> None:
    """``vllm:kv_cache_usage_perc`` is 0..1 (not a percentage), above 0 while requests run."""
    rng = random.Random(5)
    prompts = [[rng.randrange(10, 4000) for _ in range(800)] for _ in range(4)]
    threads = [
        threading.Thread(
            target=server.complete,
            args=(p,),
            kwargs={"max_tokens": 300, "ignore_eos": True},
            daemon=True,
        )
        for p in prompts
    ]
    for t in threads:
        t.start()
    seen: list[float] = []
    deadline = time.monotonic() + 60
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        seen.append(server.metrics().total("vllm:kv_cache_usage_perc"))
        time.sleep(0.02)
    for t in threads:
        t.join(timeout=60)
    seen.append(_settle(server).total("vllm:kv_cache_usage_perc"))
    assert all(0.0 <= v <= 1.0 for v in seen), max(seen)
    assert max(seen) > 0.0, "KV usage never moved while 4 requests ran"
