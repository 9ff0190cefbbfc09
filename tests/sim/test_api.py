"""OpenAI API conformance of a simulated replica, checked with the official ``openai`` client."""

from __future__ import annotations

import json
import time
from http.client import HTTPConnection
from typing import Any

import openai
import pytest

from lbtune import tokens
from lbtune.sim.host import HostThread, run_in_thread
from tests.sim.conftest import M8, M70, http, make_spec, wait_for

MSGS: list[Any] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say something about load balancers."},
]


def client(sim: HostThread, replica: str = "a") -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.urls[replica] + "/v1", api_key="x", max_retries=0)


def test_chat_non_streaming(sim: HostThread) -> None:
    r = client(sim).chat.completions.create(
        model=M8, messages=MSGS, max_tokens=7, extra_body={"ignore_eos": True}
    )
    assert r.object == "chat.completion" and r.model == M8
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 7
    assert tokens.count(choice.message.content or "") == 7
    prompt = (
        "<|system|>\nYou are terse.\n<|user|>\nSay something about load balancers.\n<|assistant|>\n"
    )
    assert r.usage.prompt_tokens == tokens.count(prompt)
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7


def test_completions_non_streaming_second_model(sim: HostThread) -> None:
    r = client(sim).completions.create(model=M70, prompt="Once upon a time", max_tokens=2000)
    assert r.object == "text_completion"
    assert r.usage is not None and r.usage.prompt_tokens == 4
    n = r.usage.completion_tokens
    assert 1 <= n <= 2000 and tokens.count(r.choices[0].text) == n
    assert r.choices[0].finish_reason == ("length" if n == 2000 else "stop")


def test_chat_streaming_with_usage(sim: HostThread) -> None:
    stream = client(sim, "b").chat.completions.create(
        model=M8,
        messages=MSGS,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    first, *content, final, usage_chunk = chunks
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert len(content) == 5
    assert all(c.choices[0].delta.content and c.choices[0].finish_reason is None for c in content)
    assert final.choices[0].finish_reason == "length"
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 5
    text = "".join(c.choices[0].delta.content or "" for c in content)
    assert tokens.count(text) == 5
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"


def test_streaming_without_usage_has_no_usage_chunk(sim: HostThread) -> None:
    chunks = list(
        client(sim).chat.completions.create(model=M8, messages=MSGS, max_tokens=3, stream=True)
    )
    assert all(c.choices and c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_completions_streaming(sim: HostThread) -> None:
    stream = client(sim).completions.create(
        model=M8,
        prompt="hello",
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert len(texts) == 4
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 1 and chunks[-1].usage.completion_tokens == 4


def test_request_id_echoed_or_generated(sim: HostThread) -> None:
    body = {"model": M8, "prompt": "hi", "max_tokens": 1}
    status, _, headers = _post_headers(
        sim.urls["a"] + "/v1/completions", body, {"x-request-id": "rid-1"}
    )
    assert status == 200 and headers["x-request-id"] == "rid-1"
    assert headers["x-sim-replica"] == "a"
    status, _, headers = _post_headers(sim.urls["a"] + "/v1/completions", body, {})
    assert len(headers["x-request-id"]) >= 16


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": MSGS, "max_tokens": 0}, "max_tokens"),
        ({"messages": MSGS, "max_tokens": 131073}, "max_tokens"),  # > max_model_len
    ],
)
def test_400s(sim: HostThread, kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as ei:
        client(sim).chat.completions.create(model=M8, **kwargs)
    assert ei.value.status_code == 400
    body: Any = ei.value.body
    assert body["param"] == param and body["code"] == 400 and body["message"]


def test_400_malformed_json_and_missing_model(sim: HostThread) -> None:
    status, body, _ = http(sim.urls["a"] + "/v1/completions", raw=b'{"model": ')
    assert status == 400 and set(body["error"]) == {"message", "type", "param", "code"}
    status, body, _ = http(sim.urls["a"] + "/v1/completions", {"prompt": "x"})
    assert status == 400 and body["error"]["param"] == "model"


def test_404_unknown_model(sim: HostThread) -> None:
    with pytest.raises(openai.NotFoundError) as ei:
        client(sim, "b").chat.completions.create(model=M70, messages=MSGS)
    assert ei.value.status_code == 404


def test_429_queue_full(sim: HostThread) -> None:
    with pytest.raises(openai.RateLimitError) as ei:
        client(sim, "full").completions.create(model=M8, prompt="x", max_tokens=1)
    assert ei.value.status_code == 429


def test_503_while_starting_and_draining() -> None:
    spec = make_spec(s=("h100-80g", [M8], {"startup_s": 0.6}))
    with run_in_thread(spec) as host:
        url = host.urls["s"]
        assert http(url + "/health")[0] == 503
        with pytest.raises(openai.InternalServerError) as ei:
            client(host, "s").completions.create(model=M8, prompt="x", max_tokens=1)
        assert ei.value.status_code == 503
        assert wait_for(lambda: http(url + "/health")[0] == 200)
        assert http(url + "/admin/drain", {})[1]["state"] == "draining"
        assert http(url + "/health")[0] == 503
        with pytest.raises(openai.InternalServerError) as ei:
            client(host, "s").chat.completions.create(model=M8, messages=MSGS, stream=True)
        assert ei.value.status_code == 503
        http(url + "/admin/ready", {})
        assert http(url + "/health")[0] == 200


def test_models_endpoint(sim: HostThread) -> None:
    ids = [m.id for m in client(sim).models.list()]
    assert ids == [M8, M70]


def test_disconnect_aborts_in_engine() -> None:
    spec = make_spec(time_scale=1.0, d=("l4-24g", [M8], {}))
    with run_in_thread(spec) as host:
        url = host.urls["d"]
        conn = HTTPConnection("127.0.0.1", host.ports["d"], timeout=10)
        body = {"model": M8, "prompt": "x", "max_tokens": 2000, "stream": True, "ignore_eos": True}
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        assert resp.status == 200
        resp.fp.readline()  # first chunk line
        assert http(url + "/admin/state")[1]["num_running"] == 1
        conn.sock.close() if conn.sock else None
        resp.close()
        assert wait_for(lambda: http(url + "/admin/state")[1]["in_flight"] == 0)
        state = http(url + "/admin/state")[1]
        assert state["num_running"] == 0 and state["num_waiting"] == 0
        metrics = http(url + "/metrics")[1]
        # vLLM 0.32 counts a request its client aborted nowhere (tests/conformance)
        assert (
            f'vllm:request_success_total{{finished_reason="abort",model_name="{M8}"}} 0.0'
            in metrics
        )
        assert f'vllm:e2e_request_latency_seconds_count{{model_name="{M8}"}} 0.0' in metrics


def test_slowdown_knob_multiplies_step_time() -> None:
    spec = make_spec(time_scale=2.0, k=("h100-80g", [M8], {}))  # steps of ~3 ms
    with run_in_thread(spec) as host:
        c = client(host, "k")

        def timed() -> float:
            t0 = time.perf_counter()
            c.completions.create(
                model=M8, prompt="x", max_tokens=30, extra_body={"ignore_eos": True}
            )
            return time.perf_counter() - t0

        base = timed()
        assert http(host.urls["k"] + "/admin/slowdown", {"factor": 4.0})[1]["slowdown"] == 4.0
        slow = timed()
        assert http(host.urls["k"] + "/admin/slowdown", {"factor": 0})[0] == 400
    assert 2.5 < slow / base < 5.0


def _raw_stream(sim: HostThread, request_id: str) -> tuple[float | None, float]:
    """(first content line read, end) on the client's clock for one raw streamed request."""
    body = {"model": M8, "messages": MSGS, "max_tokens": 20, "stream": True, "ignore_eos": True}
    conn = HTTPConnection("127.0.0.1", sim.ports["a"], timeout=10)
    conn.request(
        "POST",
        "/v1/chat/completions",
        json.dumps(body),
        {"Content-Type": "application/json", "x-request-id": request_id},
    )
    resp = conn.getresponse()
    t_first = None
    while line := resp.fp.readline():
        if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
            t_first = t_first or time.time()
        if line.startswith(b"data: [DONE]"):
            break
    t_end = time.time()
    conn.close()
    return t_first, t_end


def test_ground_truth_matches_raw_client(sim: HostThread) -> None:
    # The server stamps just after each write returns; the client thread may read first, or
    # be scheduled late on a busy machine (one read came 7 ms late). Up to three requests:
    # every one must be consistent, and one must agree within 5 ms (a wrong stamp — headers
    # or the last token for the first — is off by far more in every request).
    gaps = []
    for i in range(3):
        t_first, t_end = _raw_stream(sim, f"gt-{i}")
        status, rec, _ = http(sim.urls["a"] + f"/debug/requests/gt-{i}")
        assert status == 200 and rec["status"] == 200 and rec["output_tokens"] == 20
        assert rec["t_arrival"] <= rec["t_headers"] <= rec["t_first_token"] <= rec["t_last"]
        assert rec["t_last"] <= t_end + 0.005
        assert t_first is not None
        gaps.append(abs(t_first - rec["t_first_token"]))
        if gaps[-1] < 0.005:
            break
    assert min(gaps) < 0.005, gaps
    assert http(sim.urls["b"] + "/debug/requests/nope")[0] == 404


def _post_headers(
    url: str, body: Any, headers: dict[str, str]
) -> tuple[int, bytes, dict[str, str]]:
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    conn = HTTPConnection(host, int(port), timeout=10)
    conn.request(
        "POST",
        "/" + url.split("/", 3)[3],
        json.dumps(body),
        {"Content-Type": "application/json", **headers},
    )
    resp = conn.getresponse()
    out = resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    conn.close()
    return out
