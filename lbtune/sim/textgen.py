"""Text in and out of a simulated replica: request parsing, prompt tokens, output.

:func:`parse_request` validates an OpenAI request body (raising :class:`ApiError`
with the HTTP status: 400 bad fields, 404 model not served); the functions at the
end build the response bodies and SSE chunks in vLLM's shapes.

**Prompt tokens.** Prompts are counted with lbtune's tokenizer
(:func:`lbtune.tokens.encode`). A chat request is rendered with this template
before tokenising (the system/user/assistant headers cost 5 tokens each)::

    <|{role}|>\\n{content}\\n        (for each message, in order)
    <|assistant|>\\n                 (generation prompt)

``content`` may be a string, ``null`` or a list of ``{"type": "text", "text": ...}``
parts (other part types are ignored). A completion ``prompt`` may be a string, a
one-element list of strings, or a list of token ids.

**Output length.** ``max_tokens`` (or ``max_completion_tokens`` for chat) defaults
to ``min(256, context_length - prompt_tokens)``. With ``"ignore_eos": true`` the
replica generates exactly ``max_tokens`` tokens. Otherwise the length is a
deterministic draw, seeded by the host seed, the model and the prompt text, from
a log-normal distribution with median 128 tokens and sigma 1.0 (mean ≈ 211,
P90 ≈ 460, P99 ≈ 1310 — long-tailed, like chat answers), raised to
``min_tokens`` when given and capped at ``max_tokens``. ``finish_reason`` is
``"length"`` when ``max_tokens`` was reached, ``"stop"`` otherwise.

**Output text.** Each token is one short lowercase word with a leading space,
drawn by a generator seeded like the length, so the same request under the same
seed gets the same text, and :func:`lbtune.tokens.count` of the text equals
``completion_tokens``.

Other request fields are accepted and ignored (``temperature``, ``top_p``, ...),
except ``n`` (only 1), ``stream`` (a boolean) and ``stream_options`` (only with
``stream: true``, as vLLM).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from lbtune import tokens

Api = Literal["chat", "completions"]

DEFAULT_MAX_TOKENS = 256
OUTPUT_MEDIAN_TOKENS = 128.0
OUTPUT_SIGMA = 1.0

_WORD_LIST = (
    "the a of to and in is it for on with as at by from this that be are was "
    "not or can we you they will one all has more time some into two use any "
    "new data model token fast cache load batch queue node route gpu server "
    "test rate peak level state value path link port score weight step page block"
)
WORDS: tuple[str, ...] = tuple(_WORD_LIST.split())
assert len(WORDS) == 64 and all(len(w) <= 6 and w.isalpha() for w in WORDS)


class ApiError(Exception):
    """A request the replica refuses, as an OpenAI-style error with an HTTP status."""

    _TYPES: ClassVar[dict[int, str]] = {
        400: "BadRequestError",
        404: "NotFoundError",
        429: "RateLimitError",
        503: "ServiceUnavailableError",
    }

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        kind = self._TYPES.get(self.status, "InternalServerError")
        return {
            "error": {
                "message": self.message,
                "type": kind,
                "param": self.param,
                "code": self.status,
            }
        }


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated request, ready for the engine."""

    api: Api
    model: str
    prompt_ids: list[int]
    max_tokens: int
    output_tokens: int
    """Exactly how many tokens the engine generates."""
    stream: bool
    include_usage: bool
    text_seed: int

    @property
    def finish_reason(self) -> str:
        return "length" if self.output_tokens >= self.max_tokens else "stop"


def chat_prompt(messages: Any) -> str:
    """The prompt text of a chat request (template in the module docstring)."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", "messages")
    parts: list[str] = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, "each message needs a string 'role'", "messages")
        content = m.get("content")
        if isinstance(content, list):
            texts = [p.get("text", "") for p in content if isinstance(p, dict)]
            content = "".join(t for t in texts if isinstance(t, str))
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise ApiError(400, "message 'content' must be a string or a list", "messages")
        parts.append(f"<|{m['role']}|>\n{content}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def completion_prompt(prompt: Any) -> tuple[str, list[int]]:
    """The prompt text (for seeding) and token ids of a completion request."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, tokens.encode(prompt)
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return " ".join(map(str, prompt)), [int(t) for t in prompt]
    raise ApiError(400, "'prompt' must be a string or a list of token ids", "prompt")


def parse_request(
    api: Api,
    body: Any,
    served: Sequence[str],
    context_length: Callable[[str], int],
    seed: int,
) -> ParsedRequest:
    """Validate ``body``; raise :class:`ApiError` (400/404) when it cannot be served."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "'model' is required and must be a string", "model")
    if model not in served:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")
    if api == "chat":
        text = chat_prompt(body.get("messages"))
        prompt_ids = tokens.encode(text)
    else:
        if "prompt" not in body:
            raise ApiError(400, "'prompt' is required", "prompt")
        text, prompt_ids = completion_prompt(body["prompt"])
    if body.get("n", 1) != 1:
        raise ApiError(400, "only n=1 is supported", "n")
    stream, include_usage = _streaming(body)
    max_tokens = _max_tokens(api, body, len(prompt_ids), context_length(model))
    min_tokens = body.get("min_tokens", 0)
    if not _is_int(min_tokens) or min_tokens < 0:
        raise ApiError(400, "'min_tokens' must be an integer >= 0", "min_tokens")
    rng = random.Random(_seed(seed, model, text))
    drawn = round(math.exp(math.log(OUTPUT_MEDIAN_TOKENS) + OUTPUT_SIGMA * rng.gauss(0.0, 1.0)))
    if body.get("ignore_eos") is True:
        out = max_tokens
    else:
        out = min(max_tokens, max(1, drawn, int(min_tokens)))
    return ParsedRequest(
        api=api,
        model=model,
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        output_tokens=out,
        stream=stream,
        include_usage=include_usage,
        text_seed=rng.getrandbits(64),
    )


def _streaming(body: dict[str, Any]) -> tuple[bool, bool]:
    """``(stream, include_usage)`` of a request body."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean", "stream")
    opts = body.get("stream_options")
    if opts is not None and (not stream or not isinstance(opts, dict)):
        raise ApiError(
            400, "Stream options can only be defined when `stream=True`.", "stream_options"
        )
    return stream, bool(opts.get("include_usage", False)) if opts else False


def _max_tokens(api: Api, body: dict[str, Any], n_prompt: int, ctx: int) -> int:
    """The request's output cap within the model's context ``ctx``.

    As vLLM 0.32 does (tests/conformance): a prompt over the context or a max_tokens over
    it is refused; otherwise max_tokens is cut to what the context leaves, and refused
    when nothing is left.
    """
    key = "max_completion_tokens" if api == "chat" and "max_tokens" not in body else "max_tokens"
    raw_max = body.get(key)
    if raw_max is None:
        max_tokens = min(DEFAULT_MAX_TOKENS, ctx - n_prompt)
    elif not _is_int(raw_max) or raw_max < 1:
        raise ApiError(400, f"'{key}' must be an integer >= 1, got {raw_max!r}", key)
    else:
        max_tokens = int(raw_max)
    if n_prompt > ctx:
        raise ApiError(
            400,
            f"This model's maximum context length is {ctx} tokens. However, your prompt "
            f"contains at least {n_prompt} input tokens, which exceeds this limit even without "
            "any output tokens. Please reduce the length of the input prompt.",
            "input_tokens",
        )
    if max_tokens > ctx:
        raise ApiError(
            400,
            f"max_tokens={max_tokens} cannot be greater than max_model_len={ctx}. "
            "Please request fewer output tokens.",
            key,
        )
    max_tokens = min(max_tokens, ctx - n_prompt)
    if max_tokens < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}.", key)
    return max_tokens


class Words:
    """The deterministic output words of one request (one token each)."""

    __slots__ = ("_rng",)

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def next(self) -> str:
        """The next token's text: a space and a short word."""
        return " " + WORDS[self._rng.getrandbits(6)]

    def take(self, n: int) -> list[str]:
        """The next ``n`` tokens' texts."""
        return [self.next() for _ in range(n)]

    def text(self, n: int) -> str:
        return "".join(self.take(n))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _seed(seed: int, model: str, text: str) -> int:
    h = hashlib.blake2b(f"{seed}\x00{model}\x00".encode(), digest_size=8)
    h.update(text.encode("utf-8", "surrogatepass"))
    return int.from_bytes(h.digest(), "big")


# ------------------------------------------------------ response bodies (vLLM's shapes)


def _envelope(
    p: ParsedRequest, rid: str, choices: list[Any], whole: bool = False
) -> dict[str, Any]:
    chat = p.api == "chat"
    kind = ("chat.completion" if whole else "chat.completion.chunk") if chat else "text_completion"
    rid_prefix = "chatcmpl-" if chat else "cmpl-"
    created = int(time.time())
    return {
        "id": rid_prefix + rid,
        "object": kind,
        "created": created,
        "model": p.model,
        "choices": choices,
    }


def _choice(chat: bool, content: str, finish: str | None) -> dict[str, Any]:
    if chat:
        delta = {"content": content} if content else {}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"index": 0, "text": content, "logprobs": None, "finish_reason": finish}


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def chunk_frame(p: ParsedRequest, rid: str) -> tuple[bytes, bytes]:
    """The SSE bytes before and after a token's text (short words need no escaping)."""
    marker = "@@TOKEN@@"
    head, tail = _sse(_envelope(p, rid, [_choice(p.api == "chat", marker, None)])).split(
        marker.encode()
    )
    return head, tail


def role_chunk(p: ParsedRequest, rid: str) -> bytes:
    """Chat's first chunk: the role and empty content."""
    delta = {"role": "assistant", "content": ""}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    return _sse(_envelope(p, rid, [choice]))


def final_chunk(p: ParsedRequest, rid: str, finish_reason: str) -> bytes:
    """The chunk carrying ``finish_reason`` (no content)."""
    return _sse(_envelope(p, rid, [_choice(p.api == "chat", "", finish_reason)]))


def usage_chunk(p: ParsedRequest, rid: str, completion_tokens: int) -> bytes:
    """The ``choices: []`` chunk sent when ``stream_options.include_usage`` is true."""
    body = _envelope(p, rid, [])
    body["usage"] = usage(p, completion_tokens)
    return _sse(body)


def whole_body(p: ParsedRequest, rid: str, text: str, finish_reason: str) -> dict[str, Any]:
    """The non-streaming response body."""
    completion_tokens = tokens.count(text)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
    if p.api == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    body = _envelope(p, rid, [choice], whole=True)
    body["usage"] = usage(p, completion_tokens)
    return body


def usage(p: ParsedRequest, completion_tokens: int) -> dict[str, int]:
    n = len(p.prompt_ids)
    return {
        "prompt_tokens": n,
        "completion_tokens": completion_tokens,
        "total_tokens": n + completion_tokens,
    }
