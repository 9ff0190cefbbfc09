"""The LLM scheduler's ``mode predict`` (v2) run by a real HAProxy in front of fake replicas
(h100-0, a100-0, l4-0) whose /metrics the test sets; the engine rates are the map's facts
from the GPU profiles. What the twin's unit tests cannot show: the Lua's hold in the
balancer (``core.msleep``) and its end, a routed 200, never a 429."""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import requests

from tests.targets.haproxy_llm.conftest import M8, Cluster
from tests.targets.haproxy_llm.test_scheduler import HEADER, words

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy missing"),
]

PREDICT = {
    "llm.mode": "predict",
    "llm.refresh_ms": 50,
    "llm.stale_ms": 10000,
    "llm.admission": "route",
    "llm.kv_headroom": 0.05,
    "llm.w_decode": 1.0,
    "llm.ttft_slo_ms": 1000,
    "llm.tpot_slo_ms": 150,
    "llm.queue_timeout_ms": 300,
}


@pytest.fixture
def predict_on(cluster: Cluster) -> Iterator[Cluster]:
    cluster.start_llm(PREDICT)
    yield cluster


def ask(cluster: Cluster, content: str, max_tokens: int) -> requests.Response:
    msg = {"role": "user", "content": content}
    body = {"model": M8, "max_tokens": max_tokens, "messages": [msg]}
    return cluster.chat("", body=json.dumps(body))


def test_an_idle_cluster_sends_each_request_to_the_fastest_replica(predict_on: Cluster) -> None:
    seen = Counter(ask(predict_on, words(60), 100).headers[HEADER] for _ in range(10))
    assert seen == Counter({"h100-0": 10})


def test_a_busy_replica_loses_to_a_slower_idle_one_by_predicted_latency(
    predict_on: Cluster,
) -> None:
    # 400 requests in h100-0's batch: its decode step becomes ~31 ms against the idle
    # A100's ~11 ms, so a 100-token answer is predicted ~3 s there and ~1.2 s on the A100
    predict_on.replicas["h100-0"].running = 300
    predict_on.replicas["h100-0"].waiting = 100
    predict_on.wait_metric('lbtune_llm_waiting{server="h100-0"}', lambda v: v == 100)
    seen = Counter(ask(predict_on, words(60), 100).headers[HEADER] for _ in range(10))
    assert seen == Counter({"a100-0": 10})
    # by TTFT alone (w_decode 0) a long prompt is ~0.37 s on the busy H100 (its prefill
    # is 3x the A100's) against ~1 s on the A100
    predict_on.target.apply({"llm.w_decode": 0.0})
    assert ask(predict_on, words(1500), 100).headers[HEADER] == "h100-0"


def test_no_replica_within_the_slos_holds_then_routes_with_a_200(predict_on: Cluster) -> None:
    # TPOT SLO 10 ms: only an H100 decodes that fast (~6.4 ms a step alone), and h100-0's
    # batch of 300 makes its step ~25 ms. Nobody is within the SLOs now, h100-0 would be
    # once its batch drains: the request waits in the balancer, then is routed anyway.
    predict_on.target.apply({"llm.tpot_slo_ms": 10})
    predict_on.replicas["h100-0"].running = 300
    predict_on.set_kv({"h100-0": 0.01})  # the scrape that shows the batch has happened
    before = predict_on.metrics()
    t0 = time.monotonic()
    r = ask(predict_on, words(20), 16)
    waited = time.monotonic() - t0
    assert r.status_code == 200
    assert waited >= 0.3  # queue_timeout_ms
    after = predict_on.metrics()
    assert after["lbtune_llm_held_total"] == before["lbtune_llm_held_total"] + 1
    assert after["lbtune_llm_hold_expired_total"] == before["lbtune_llm_hold_expired_total"] + 1
    assert after["lbtune_llm_rejected_total"] == before["lbtune_llm_rejected_total"]
    # its batch gone, h100-0 meets both SLOs: routed there at once, no hold
    predict_on.replicas["h100-0"].running = 0
    predict_on.set_kv({"h100-0": 0.02})
    t0 = time.monotonic()
    r = ask(predict_on, words(20), 16)
    assert r.status_code == 200 and r.headers[HEADER] == "h100-0"
    assert time.monotonic() - t0 < 0.3
    assert predict_on.metrics()["lbtune_llm_held_total"] == after["lbtune_llm_held_total"]
