"""The OpenAI API as vLLM serves it, checked against the simulator and real vLLM alike.

Where the simulator differs on purpose the test says why; the text itself never
compares (the sim writes one short word per token, the tiny model random bytes).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance.conftest import Server, sse_events

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

APIS = ["chat", "completions"]


def _send(server: Server, api: str, **fields: Any) -> Any:
    return server.chat(**fields) if api == "chat" else server.complete(**fields)


def _usage_ok(usage: dict[str, Any]) -> None:
    assert usage["prompt_tokens"] >= 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_health(server: Server) -> None:
    import requests

    assert requests.get(server.url + "/health", timeout=10).status_code == 200


def test_models_lists_the_served_model(server: Server) -> None:
    import requests

    body = requests.get(server.url + "/v1/models", timeout=10).json()
    assert body["object"] == "list"
    (entry,) = [m for m in body["data"] if m["id"] == server.model]
    assert entry["object"] == "model"
    assert isinstance(entry["max_model_len"], int) and entry["max_model_len"] > 0


@pytest.mark.parametrize("api", APIS)
def test_whole_response(server: Server, api: str) -> None:
    resp = _send(server, api, max_tokens=8, ignore_eos=True)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    chat = api == "chat"
    assert body["object"] == ("chat.completion" if chat else "text_completion")
    assert body["id"].startswith("chatcmpl-" if chat else "cmpl-")
    assert body["model"] == server.model
    (choice,) = body["choices"]
    assert choice["index"] == 0
    if chat:
        assert choice["message"]["role"] == "assistant"
        assert isinstance(choice["message"]["content"], str)
    else:
        assert isinstance(choice["text"], str)
    assert choice["finish_reason"] == "length"
    _usage_ok(body["usage"])
    assert body["usage"]["completion_tokens"] == 8


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("api", APIS)
def test_stream_shape(server: Server, api: str, include_usage: bool) -> None:
    """SSE: chunks of one id, one ``finish_reason`` on the last choice chunk, then (with
    ``stream_options.include_usage``) a ``choices: []`` usage chunk, then ``[DONE]``.

    vLLM puts a chat stream's ``finish_reason`` on the last content chunk; the sim sends it
    in a chunk of its own with an empty delta. Both are the last chunk with choices, which
    is what clients read."""
    fields: dict[str, Any] = {"max_tokens": 6, "ignore_eos": True, "stream": True}
    if include_usage:
        fields["stream_options"] = {"include_usage": True}
    events = sse_events(_send(server, api, **fields))
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = events[:-1]
    chat = api == "chat"
    kind = "chat.completion.chunk" if chat else "text_completion"
    assert {c["object"] for c in chunks} == {kind}
    assert len({c["id"] for c in chunks}) == 1
    with_choices = [c for c in chunks if c["choices"]]
    if chat:
        assert with_choices[0]["choices"][0]["delta"].get("role") == "assistant"
    finishes = [c["choices"][0]["finish_reason"] for c in with_choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    usage_chunks = [c for c in chunks if c.get("usage")]
    if include_usage:
        assert chunks[-1]["choices"] == [] and usage_chunks == [chunks[-1]]
        _usage_ok(chunks[-1]["usage"])
        assert chunks[-1]["usage"]["completion_tokens"] == 6
    else:
        assert usage_chunks == [] and all(c["choices"] for c in chunks)
    key = "delta" if chat else "text"
    texts = [c["choices"][0][key] for c in with_choices]
    content = [t.get("content") for t in texts] if chat else texts
    assert any(content), "no content in the stream"


@pytest.mark.parametrize("api", APIS)
def test_ignore_eos_gives_exactly_max_tokens(server: Server, api: str) -> None:
    resp = _send(server, api, max_tokens=40, ignore_eos=True)
    body = resp.json()
    assert body["usage"]["completion_tokens"] == 40
    assert body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("api", APIS)
def test_max_tokens_caps_the_answer(server: Server, api: str) -> None:
    body = _send(server, api, max_tokens=3).json()
    n, finish = body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"]
    assert 1 <= n <= 3
    assert finish == ("length" if n == 3 else "stop")


def test_finish_reason_stop(server: Server) -> None:
    """An answer that ends before ``max_tokens`` says ``stop``.

    vLLM stops at a stop string (here: part of its own greedy answer; the random-weight
    model rarely samples EOS). The sim differs on purpose: it matches no stop strings,
    it draws each answer's length (median 128 tokens), so an answer under a large
    ``max_tokens`` ends with ``stop``."""
    if server.kind == "sim":
        body = server.chat("tell me a story", max_tokens=2000).json()
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["usage"]["completion_tokens"] < 2000
        return
    greedy = {"temperature": 0.0, "max_tokens": 24, "ignore_eos": True}
    text = server.complete("the cache", **greedy).json()["choices"][0]["text"]
    tail = text[len(text) // 2 :].strip()
    assert tail, f"no text to stop at in {text!r}"
    body = server.complete("the cache", **{**greedy, "stop": [tail[:2]]}).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] < 24


# ------------------------------------------------------------------------ errors


def _error(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    assert err["code"] == status
    assert set(err) >= {"message", "type", "param", "code"}
    return dict(err)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("stream", [False, True])
def test_unknown_model_is_404(server: Server, api: str, stream: bool) -> None:
    body: dict[str, Any] = {"model": "no-such-model", "max_tokens": 2, "stream": stream}
    body |= {"messages": [{"role": "user", "content": "hi"}]} if api == "chat" else {"prompt": "x"}
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    err = _error(server.post(path, body), 404)
    assert err["type"] == "NotFoundError" and err["param"] == "model"
    assert "no-such-model" in err["message"]


def test_prompt_over_the_context_is_400(server: Server) -> None:
    ctx = server.context_length()
    err = _error(server.complete([100] * (ctx + 1), max_tokens=1), 400)
    assert err["type"] == "BadRequestError" and err["param"] == "input_tokens"
    assert "maximum context length" in err["message"]


def test_max_tokens_over_the_context_is_400(server: Server) -> None:
    ctx = server.context_length()
    err = _error(server.chat(max_tokens=ctx + 1), 400)
    assert err["type"] == "BadRequestError" and err["param"] == "max_tokens"


def test_max_tokens_is_cut_to_what_the_context_leaves(server: Server) -> None:
    """A prompt that fits, with a ``max_tokens`` that does not: vLLM 0.32 answers with
    what is left of the context (``length``), it does not refuse. With no room left it
    refuses (400, ``max_tokens``)."""
    ctx = server.context_length()
    body = server.complete([100] * (ctx - 3), max_tokens=10, ignore_eos=True).json()
    assert body["usage"]["completion_tokens"] == 3
    assert body["choices"][0]["finish_reason"] == "length"
    err = _error(server.complete([100] * ctx, max_tokens=1), 400)
    assert err["param"] == "max_tokens"


@pytest.mark.parametrize(
    "body",
    ['{"model": ', "[1, 2]", '{"model": "M"}', '{"model": "M", "prompt": "x", "max_tokens": 0}'],
    ids=["bad-json", "not-an-object", "no-prompt", "max-tokens-0"],
)
def test_malformed_body_is_400(server: Server, body: str) -> None:
    """The error's ``type`` for a body that is not JSON or not an object is vLLM's
    ``Bad Request`` (FastAPI validation), the sim's ``BadRequestError``: lbtune reads
    the status and the message, not that type."""
    _error(server.post("/v1/completions", body.replace('"M"', f'"{server.model}"')), 400)
