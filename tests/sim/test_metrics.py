"""``GET /metrics`` as Prometheus would scrape it, and the exporter's building blocks."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import openai

from lbtune.sim.groundtruth import GroundTruthLog
from lbtune.sim.host import HostThread
from lbtune.sim.metrics import (
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    BusyClock,
    Histogram,
)
from tests.conformance.families import DCGM_GAUGES, INFO_GAUGES, VLLM_TYPES
from tests.sim.conftest import M8, M70, http

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"')

EXPECTED_TYPES = {
    **VLLM_TYPES,
    **dict.fromkeys(INFO_GAUGES, "gauge"),
    **dict.fromkeys(DCGM_GAUGES, "gauge"),
}
ENGINE_GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
)


def parse(text: str) -> tuple[dict[str, str], Series]:
    """A minimal parser of the text format 0.0.4: TYPE lines and samples."""
    types: dict[str, str] = {}
    samples: Series = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in types, f"duplicate TYPE for {name}"
            types[name] = kind
        elif line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            assert m, f"bad sample line: {line!r}"
            labels = frozenset(_LABEL.findall(m.group(2) or ""))
            key = (m.group(1), labels)
            assert key not in samples, f"duplicate series {line!r}"
            samples[key] = float(m.group(3))
    return types, samples


def family(samples: Series, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def scrape(sim: HostThread, replica: str) -> tuple[dict[str, str], Series]:
    status, text, headers = http(sim.urls[replica] + "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    return parse(text)


def test_every_name_and_type(sim: HostThread) -> None:
    types, samples = scrape(sim, "a")
    assert types == EXPECTED_TYPES
    names = {n for n, _ in samples}
    for name, kind in EXPECTED_TYPES.items():
        if kind == "histogram":
            assert {f"{name}_bucket", f"{name}_count", f"{name}_sum"} <= names
        else:
            assert name in names
    assert all("replica" not in dict(labels) for _, labels in samples)


def test_one_engine_series_per_replica_labelled_with_first_model(sim: HostThread) -> None:
    for replica in ("a", "b"):
        _, samples = scrape(sim, replica)
        for name in ENGINE_GAUGES:
            series = family(samples, name)
            assert list(series) == [frozenset({("model_name", M8)})], (replica, name)
    _, samples = scrape(sim, "a")
    assert {dict(k)["model_name"] for k in family(samples, "vllm:prompt_tokens_total")} == {M8, M70}
    dcgm = family(samples, "DCGM_FI_DEV_FB_USED")
    assert list(dcgm) == [frozenset({("gpu", "0"), ("modelName", "h100-80g")})]


def test_counters_and_histograms_move_with_requests(sim: HostThread) -> None:
    _, before = scrape(sim, "b")
    c = openai.OpenAI(base_url=sim.urls["b"] + "/v1", api_key="x", max_retries=0)
    for i in range(3):
        c.completions.create(
            model=M8, prompt=f"count {i}", max_tokens=6, extra_body={"ignore_eos": True}
        )
    _, after = scrape(sim, "b")
    lab = frozenset({("model_name", M8)})

    def delta(name: str, labels: frozenset[tuple[str, str]] = lab) -> float:
        return after[(name, labels)] - before.get((name, labels), 0.0)

    assert delta("vllm:generation_tokens_total") == 18
    assert delta("vllm:prompt_tokens_total") == 6
    assert delta("vllm:prefix_cache_queries_total") >= 6
    assert delta("vllm:request_success_total", lab | {("finished_reason", "length")}) == 3
    for h in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
    ):
        assert delta(f"{h}_count") == 3
        assert delta(f"{h}_sum") > 0 or h == "vllm:request_queue_time_seconds"
    assert delta("vllm:inter_token_latency_seconds_count") == 15
    util = after[("DCGM_FI_DEV_GPU_UTIL", frozenset({("gpu", "0"), ("modelName", "l4-24g")}))]
    assert 0 < util <= 100


def test_histogram_buckets_are_vllms_and_cumulative(sim: HostThread) -> None:
    _, samples = scrape(sim, "b")
    lab = {("model_name", M8)}
    for name, bounds in (
        ("vllm:time_to_first_token_seconds", TTFT_BUCKETS),
        ("vllm:inter_token_latency_seconds", ITL_BUCKETS),
        ("vllm:e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS),
        ("vllm:request_queue_time_seconds", REQUEST_LATENCY_BUCKETS),
    ):
        buckets = {
            dict(k)["le"]: v for k, v in family(samples, f"{name}_bucket").items() if lab <= k
        }
        assert list(buckets) == [repr(float(b)) for b in bounds] + ["+Inf"]  # as vLLM writes
        counts = list(buckets.values())
        assert counts == sorted(counts)
        assert counts[-1] == samples[(f"{name}_count", frozenset(lab))]
    assert len(TTFT_BUCKETS) == 22 and len(ITL_BUCKETS) == 19 and len(REQUEST_LATENCY_BUCKETS) == 21


def test_memory_gauges_add_up(sim: HostThread) -> None:
    _, samples = scrape(sim, "a")
    used = next(iter(family(samples, "DCGM_FI_DEV_FB_USED").values()))
    free = next(iter(family(samples, "DCGM_FI_DEV_FB_FREE").values()))
    assert abs(used + free - 81559) <= 1
    assert used > 40_000  # 8B (16 GB) + 70B AWQ (~40 GB) weights


def test_histogram_le_is_inclusive() -> None:
    h = Histogram((0.1, 1.0))
    h.observe(0.1)
    h.observe(0.5, 2)
    h.observe(5.0)
    assert h.counts == [1, 2, 1] and h.count == 4 and abs(h.sum - 6.1) < 1e-9


def test_busy_clock_utilisation() -> None:
    clock = BusyClock()
    t0 = clock._snapshots[0][0]
    clock.start(t0)
    clock.stop(t0 + 0.25)
    assert abs(clock.utilisation(t0 + 1.0) - 25.0) < 1e-6
    clock.start(t0 + 1.5)
    assert abs(clock.utilisation(t0 + 2.0) - 50.0) < 1e-6  # since the previous scrape
    assert abs(clock.utilisation(t0 + 2.1) - 100 * 0.6 / 1.1) < 1e-6  # that one is too recent


def test_ground_truth_log_file_and_lru(tmp_path: Path) -> None:
    path = tmp_path / "gt.jsonl"
    log = GroundTruthLog(str(path), capacity=2)
    for i in range(3):
        log.record({"request_id": f"r{i}", "status": 200})
    assert log.get("r0") is None and log.get("r2") == {"request_id": "r2", "status": 200}
    log.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["request_id"] for x in lines] == ["r0", "r1", "r2"]


def test_success_counter_labels_are_vllms(sim: HostThread) -> None:
    _, samples = scrape(sim, "a")
    reasons: dict[str, set[str]] = defaultdict(set)
    for labels in family(samples, "vllm:request_success_total"):
        d = dict(labels)
        reasons[d["model_name"]].add(d["finished_reason"])
    every = {"stop", "length", "abort", "error", "repetition"}
    assert reasons == {M8: every, M70: every}


def test_multi_turn_history_hits_the_prefix_cache(sim: HostThread) -> None:
    c = openai.OpenAI(base_url=sim.urls["b"] + "/v1", api_key="x", max_retries=0)
    system = {"role": "system", "content": " ".join(f"rule{i}" for i in range(200))}
    turn1: list[Any] = [system, {"role": "user", "content": "first question"}]
    r1 = c.chat.completions.create(model=M8, messages=turn1, max_tokens=40)
    _, before = scrape(sim, "b")
    answer = {"role": "assistant", "content": r1.choices[0].message.content}
    turn2: list[Any] = [*turn1, answer, {"role": "user", "content": "and then?"}]
    r2 = c.chat.completions.create(model=M8, messages=turn2, max_tokens=5)
    _, after = scrape(sim, "b")
    lab = frozenset({("model_name", M8)})
    hits = (
        after[("vllm:prefix_cache_hits_total", lab)] - before[("vllm:prefix_cache_hits_total", lab)]
    )
    assert r1.usage is not None and r2.usage is not None
    # the whole first turn, its answer included, is cached (in full 16-token blocks)
    assert hits >= (r1.usage.total_tokens // 16) * 16 - 16
