"""The worker endpoints an LLM router calls on a replica, in vLLM's formats.

`vllm-router` (PyPI, Rust) asks every worker, for each request under its
``cache_aware`` policy, to render and tokenize the prompt, and polls worker load
under ``power_of_two``. A real vLLM answers these; so does the simulated replica
once :func:`add_router_routes` has added them to its ``aiohttp`` application:

* ``POST /tokenize`` — ``{"model", "prompt"}`` or ``{"model", "messages"}`` (chat,
  rendered with the sim's chat template, see :mod:`lbtune.sim.textgen`) →
  ``{"count", "max_model_len", "tokens": [...], "token_strs": null}``.
* ``POST /v1/chat/completions/render`` — a chat completion request → vLLM's
  ``GenerateRequest``: ``{"request_id": "chatcmpl-...", "token_ids": [...],
  "features": null, "sampling_params": {...}, "model", "stream", "cache_salt",
  "priority", "kv_transfer_params"}``.
* ``POST /v1/completions/render`` — a completion request → a list with one such
  object per prompt (``request_id`` ``cmpl-...``).
* ``GET /get_load`` — ``{"load": running + waiting, "num_requests_running",
  "num_requests_waiting", "kv_cache_usage_perc"}``; the router reads ``load`` (an
  integer: requests on the replica, the unit of its own in-flight counter).

Token ids are :func:`lbtune.tokens.encode` of the same text the replica feeds its
engine, so a router that routes on them sees the prefixes the sim's prefix cache
hashes. Errors are OpenAI-style (400 bad body, 404 model not served, 503 replica
not ready), like the replica's other endpoints.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from aiohttp import web

from lbtune import tokens
from lbtune.sim.engine import Engine
from lbtune.sim.profiles import ModelProfile
from lbtune.sim.spec import ReplicaSpec
from lbtune.sim.textgen import ApiError, chat_prompt, completion_prompt

__all__ = ["Replica", "add_router_routes"]


class Replica(Protocol):
    """What these endpoints read of a replica (:class:`lbtune.sim.server.Replica`)."""

    name: str
    state: str
    spec: ReplicaSpec
    engine: Engine

    @property
    def model_profiles(self) -> Mapping[str, ModelProfile]: ...


_SAMPLING_FIELDS = (
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "ignore_eos",
)


def add_router_routes(app: web.Application, replica: Replica) -> None:
    """Add ``/tokenize``, the two ``/render`` endpoints and ``/get_load`` to ``app``."""
    api = _RouterApi(replica)
    app.add_routes(
        [
            web.post("/tokenize", api.tokenize),
            web.post("/v1/chat/completions/render", api.render_chat),
            web.post("/v1/completions/render", api.render_completions),
            web.get("/get_load", api.get_load),
        ]
    )


class _RouterApi:
    def __init__(self, replica: Replica) -> None:
        self.replica = replica

    # ------------------------------------------------------------------ helpers

    async def _body(self, request: web.Request) -> dict[str, Any]:
        if self.replica.state != "ready":
            raise ApiError(503, f"replica {self.replica.name} is {self.replica.state}")
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"malformed JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return body

    def _model(self, body: dict[str, Any], required: bool) -> str:
        served = self.replica.spec.models
        model = body.get("model")
        if model is None and not required:
            return served[0]
        if not isinstance(model, str):
            raise ApiError(400, "'model' is required and must be a string", "model")
        if model not in served:
            raise ApiError(404, f"The model `{model}` does not exist.", "model")
        return model

    def _max_model_len(self, model: str) -> int:
        return self.replica.model_profiles[model].context_length

    def _generate_request(
        self, body: dict[str, Any], model: str, ids: list[int], prefix: str
    ) -> dict[str, Any]:
        ctx = self._max_model_len(model)
        if len(ids) >= ctx:
            raise ApiError(
                400,
                f"This model's maximum context length is {ctx} tokens. However, your "
                f"request has {len(ids)} input tokens.",
                "messages" if prefix == "chatcmpl" else "prompt",
            )
        sampling = {k: body[k] for k in _SAMPLING_FIELDS if body.get(k) is not None}
        sampling.setdefault("max_tokens", sampling.pop("max_completion_tokens", None))
        if sampling["max_tokens"] is None:
            sampling["max_tokens"] = ctx - len(ids)
        return {
            "request_id": f"{prefix}-{uuid.uuid4().hex}",
            "token_ids": ids,
            "features": None,
            "sampling_params": sampling,
            "model": model,
            "stream": bool(body.get("stream", False)),
            "stream_options": body.get("stream_options"),
            "cache_salt": body.get("cache_salt"),
            "priority": body.get("priority", 0),
            "kv_transfer_params": body.get("kv_transfer_params"),
        }

    @staticmethod
    def _error(err: ApiError) -> web.Response:
        return web.json_response(err.body(), status=err.status)

    # ---------------------------------------------------------------- endpoints

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            model = self._model(body, required=False)
            if "messages" in body:
                text = chat_prompt(body["messages"])
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
            else:
                raise ApiError(400, "give a string 'prompt' or a list of 'messages'", "prompt")
        except ApiError as err:
            return self._error(err)
        pieces = tokens.split(text)
        return web.json_response(
            {
                "count": len(pieces),
                "max_model_len": self._max_model_len(model),
                "tokens": [tokens.token_id(p) for p in pieces],
                "token_strs": pieces if body.get("return_token_strs") else None,
            }
        )

    async def render_chat(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            model = self._model(body, required=True)
            ids = tokens.encode(chat_prompt(body.get("messages")))
            return web.json_response(self._generate_request(body, model, ids, "chatcmpl"))
        except ApiError as err:
            return self._error(err)

    async def render_completions(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            model = self._model(body, required=True)
            if "prompt" not in body:
                raise ApiError(400, "'prompt' is required", "prompt")
            prompt = body["prompt"]
            batch = (
                prompt
                if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list))
                else [prompt]
            )
            out = [
                self._generate_request(body, model, completion_prompt(p)[1], "cmpl") for p in batch
            ]
            return web.json_response(out)
        except ApiError as err:
            return self._error(err)

    async def get_load(self, request: web.Request) -> web.Response:
        engine = self.replica.engine
        running, waiting = engine.num_running, engine.num_waiting
        return web.json_response(
            {
                "load": running + waiting,
                "num_requests_running": running,
                "num_requests_waiting": waiting,
                "kv_cache_usage_perc": engine.kv_usage,
            }
        )
