"""The LLM scheduler (algorithm: llm) run by a real HAProxy in front of fake replicas whose
/metrics the test sets: filters, scorers, admission, fallbacks, live knobs."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from lbtune.targets.haproxy import llm
from tests.targets.haproxy_llm.conftest import M8, Cluster

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy missing"),
]

HEADER = "X-Lbtune-Replica"
# Only the filters and the named scorer decide: every other weight is 0.
QUIET = {
    "llm.mode": "score",
    "llm.w_queue": 0.0,
    "llm.w_kv": 0.0,
    "llm.w_load": 0.0,
    "llm.w_ttft": 0.0,
    "llm.w_prefix": 0.0,
    "llm.w_session": 0.0,
    "llm.long_bias": 0.0,
    "llm.short_bias": 0.0,
    "llm.admission": "route",
    "llm.refresh_ms": 50,
    "llm.stale_ms": 10000,
    "llm.picker": "max",
    "llm.short_tokens": 512,
    "llm.long_tokens": 4096,
    "llm.kv_headroom": 0.05,
    "llm.queue_timeout_ms": 5000,
}


def words(n: int) -> str:
    """n distinct-ish words: a prompt no earlier request shares a prefix with."""
    tag = uuid.uuid4().hex
    return " ".join(f"{tag}{i}" for i in range(n))


@pytest.fixture
def llm_on(cluster: Cluster) -> Iterator[Cluster]:
    """The scheduler with QUIET knobs, every replica empty and its metrics fresh."""
    cluster.start_llm(QUIET)
    yield cluster
    cluster.target.runtime.execute([f"set map {_map(cluster)} fault none"])


def _map(cluster: Cluster) -> Path:
    return llm.LlmFiles.in_dir(cluster.target.state_dir).map


def test_switching_to_llm_reloads_and_its_knobs_then_change_live(cluster: Cluster) -> None:
    result = cluster.target.apply({"algorithm": "llm", **QUIET})
    reloads = cluster.target.reload_count()
    assert cluster.chat("hello").status_code == 200
    changed = cluster.target.apply({"llm.w_prefix": 2.5, "llm.admission": "reject"})
    assert changed.changed and not changed.reloaded
    assert cluster.target.reload_count() == reloads
    live = llm.read_live(cluster.target.runtime, llm.LlmFiles.in_dir(cluster.target.state_dir))
    assert live["w_prefix"] == "2.5" and live["admission"] == "reject"
    assert cluster.target.read_live()["llm.w_prefix"] == 2.5
    # read-back is the worker's map, not lbtune's record: a change made elsewhere shows
    cluster.target.runtime.execute([f"set map {_map(cluster)} w_prefix 3.25"])
    assert cluster.target.read_live()["llm.w_prefix"] == 3.25
    assert result.applied["algorithm"] == "llm"


def test_a_long_prompt_avoids_the_replica_whose_kv_is_nearly_full(llm_on: Cluster) -> None:
    # h100-0 has ~430k tokens of KV: 4 % free is ~17k tokens minus the 5 % headroom: none.
    # With every weight at 0 only the KV filter keeps the long prompts away from it.
    llm_on.set_kv({"h100-0": 0.96})
    seen = Counter(llm_on.chat(words(1000)).headers[HEADER] for _ in range(12))
    assert seen["h100-0"] == 0 and sum(seen.values()) == 12
    # ... while it still takes prompts when it has room again
    llm_on.set_kv({"h100-0": 0.0})
    seen = Counter(llm_on.chat(words(1000)).headers[HEADER] for _ in range(24))
    assert seen["h100-0"] > 0


def test_a_shared_prefix_burst_goes_to_the_replica_that_holds_the_prefix(
    llm_on: Cluster,
) -> None:
    llm_on.target.apply({"llm.w_prefix": 1.0})
    # ~5 KB (~1.3k tokens): 16 blocks, and 13 of them fit even the L4 between two scrapes
    prefix = words(150)
    first = llm_on.chat(prefix + " question zero").headers[HEADER]
    seen = Counter(llm_on.chat(prefix + f" question {i}").headers[HEADER] for i in range(12))
    assert seen == Counter({first: 12})
    # other prompts spread (random tie-break among equal scores)
    others = Counter(llm_on.chat(words(150)).headers[HEADER] for _ in range(24))
    assert len(others) > 1


def test_session_affinity_keeps_a_session_on_its_replica(llm_on: Cluster) -> None:
    llm_on.target.apply({"llm.w_session": 1.0})
    hdr = {"X-Session-Id": uuid.uuid4().hex}
    first = llm_on.chat(words(50), hdr).headers[HEADER]
    assert {llm_on.chat(words(50), hdr).headers[HEADER] for _ in range(10)} == {first}


def test_queue_score_prefers_the_replica_with_the_shortest_queue(llm_on: Cluster) -> None:
    for n, w in (("h100-0", 12), ("a100-0", 0), ("l4-0", 6)):
        llm_on.replicas[n].waiting = w
    llm_on.target.apply({"llm.w_queue": 1.0})
    for n, w in (("h100-0", 12), ("l4-0", 6)):
        llm_on.wait_metric(f'lbtune_llm_waiting{{server="{n}"}}', lambda v, w=w: v == w)
    assert {llm_on.chat(words(50)).headers[HEADER] for _ in range(10)} == {"a100-0"}


def _sum(m: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in m.items() if k.startswith(prefix))


def test_inflight_tokens_are_held_until_the_replica_answers_then_released(
    llm_on: Cluster,
) -> None:
    for r in llm_on.replicas.values():
        r.delay_s, r.answer = 20.0, threading.Event()
    result: list[requests.Response] = []

    def send() -> None:
        resp = requests.post(
            llm_on.url + "/v1/chat/completions",
            json={"model": M8, "messages": [{"role": "user", "content": words(400)}]},
            timeout=30,
        )
        result.append(resp)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        deadline = time.monotonic() + 10  # routed, not answered yet: its tokens are held
        while _sum(llm_on.metrics(), "lbtune_llm_inflight_tokens") < 400 * 33 / 4 * 0.9:
            assert time.monotonic() < deadline, "the routed request's tokens were never held"
            time.sleep(0.02)
    finally:
        for r in llm_on.replicas.values():
            r.answer.set()
        sender.join(30)
        for r in llm_on.replicas.values():
            r.delay_s = 0.0
    assert result and result[0].status_code == 200
    deadline = time.monotonic() + 10
    while _sum(llm_on.metrics(), "lbtune_llm_inflight_tokens") != 0:
        assert time.monotonic() < deadline, "in-flight tokens never released"
        time.sleep(0.02)


def test_admission_reject_answers_429_with_retry_after(llm_on: Cluster) -> None:
    llm_on.target.apply({"llm.admission": "reject"})
    llm_on.set_kv({n: 0.99 for n in llm_on.replicas})
    before = llm_on.metrics()["lbtune_llm_rejected_total"]
    r = llm_on.chat(words(100))
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    assert "kv_cache_full" in r.text
    assert llm_on.metrics()["lbtune_llm_rejected_total"] == before + 1


def test_admission_hold_waits_then_routes_when_room_appears(llm_on: Cluster) -> None:
    llm_on.target.apply({"llm.admission": "hold", "llm.queue_timeout_ms": 20000})
    llm_on.set_kv({n: 0.99 for n in llm_on.replicas})
    held = llm_on.metrics()["lbtune_llm_held_total"]
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(llm_on.chat(words(100)).status_code))
    t.start()
    llm_on.wait_metric("lbtune_llm_held_total", lambda v: v > held)
    assert not out  # still held
    llm_on.replicas["a100-0"].kv = 0.0
    t.join(timeout=30)
    assert out == [200]


def test_admission_hold_times_out_with_429(llm_on: Cluster) -> None:
    llm_on.target.apply({"llm.admission": "hold", "llm.queue_timeout_ms": 300})
    llm_on.set_kv({n: 0.99 for n in llm_on.replicas})
    assert llm_on.chat(words(100)).status_code == 429


def fallback(c: Cluster, reason: str) -> float:
    return c.metrics()[f'lbtune_llm_fallback_total{{reason="{reason}"}}']


def test_a_lua_error_falls_back_to_leastconn_with_a_2xx(llm_on: Cluster) -> None:
    before = fallback(llm_on, "lua_error")
    llm_on.target.runtime.execute([f"set map {_map(llm_on)} fault error"])
    assert all(llm_on.chat(words(20)).status_code == 200 for _ in range(3))
    assert fallback(llm_on, "lua_error") == before + 3


def test_an_unparseable_body_falls_back_to_leastconn_with_a_2xx(llm_on: Cluster) -> None:
    before = fallback(llm_on, "bad_body")
    r = llm_on.chat("", body=f'{{"model": "{M8}", this is not json')
    assert r.status_code == 200
    assert fallback(llm_on, "bad_body") == before + 1


def test_missing_metrics_fall_back_to_own_load_with_a_2xx(llm_on: Cluster) -> None:
    llm_on.target.apply({"llm.stale_ms": 200})
    errors = llm_on.metrics()["lbtune_llm_scrape_errors_total"]
    llm_on.set_kv({"h100-0": 0.99})  # fresh: the filter would keep prompts off it
    for r in llm_on.replicas.values():
        r.metrics_ok = False
    llm_on.wait_metric('lbtune_llm_state_age_seconds{server="h100-0"}', lambda v: v > 0.3)
    assert llm_on.metrics()["lbtune_llm_scrape_errors_total"] > errors
    # stale: the KV filter no longer trusts the 0.99 and h100-0 is a candidate again
    seen: Counter[str] = Counter()
    for _ in range(30):
        resp = llm_on.chat(words(50))
        assert resp.status_code == 200
        seen[resp.headers[HEADER]] += 1
    assert seen["h100-0"] > 0


def test_length_classes_bias_long_prompts_to_long_context_replicas(llm_on: Cluster) -> None:
    llm_on.target.apply({"llm.long_bias": 1.0, "llm.short_bias": 1.0, "llm.long_tokens": 2048})
    long_seen = {llm_on.chat(words(400)).headers[HEADER] for _ in range(12)}  # ~3.5k tokens
    assert long_seen <= {"h100-0", "a100-0"} and long_seen  # ≥ 90 % of the largest GPU
    short_seen = {llm_on.chat("hi " + words(5)).headers[HEADER] for _ in range(6)}
    assert short_seen == {"l4-0"}  # the short bias goes to the other replicas


def test_power_of_two_choices_never_picks_the_worst_of_three(llm_on: Cluster) -> None:
    llm_on.replicas["h100-0"].waiting = 12
    llm_on.target.apply({"llm.w_queue": 1.0, "llm.picker": "p2c"})
    llm_on.wait_metric('lbtune_llm_waiting{server="h100-0"}', lambda v: v == 12)
    seen = Counter(llm_on.chat(words(50)).headers[HEADER] for _ in range(30))
    assert seen["h100-0"] == 0 and seen["a100-0"] > 0 and seen["l4-0"] > 0
