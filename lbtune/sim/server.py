"""One simulated vLLM replica over HTTP: the OpenAI API, metrics and sim knobs.

A :class:`Replica` owns one :class:`~lbtune.sim.engine.Engine` (one simulated GPU)
and one ``aiohttp`` application; :mod:`lbtune.sim.host` serves several in one
event loop. A *GPU loop* task runs the engine: while it has work it takes a step,
sleeps until an absolute deadline (``previous deadline + duration × slowdown /
time_scale``, so timer slack never accumulates; more than 50 ms behind, the
deadline is reset to now) and hands the step's tokens to the waiting responses.

Endpoints:

* ``POST /v1/chat/completions``, ``POST /v1/completions`` — streaming (SSE as vLLM
  writes it: for chat a role-only first chunk, then one chunk per token, a chunk
  with ``finish_reason``, a ``choices: []`` usage chunk when
  ``stream_options.include_usage`` is true, then ``data: [DONE]``; every chunk is
  its own write) and non-streaming. Request fields, output length and text: see
  :mod:`lbtune.sim.textgen`. Every request first spends the GPU profile's
  ``request_overhead_s`` (API server, tokenisation) divided by the time scale.
  ``x-request-id`` is echoed (generated when absent); ``x-sim-replica`` names the
  replica. Errors are OpenAI-style ``{"error": {message, type, param, code}}``: 400
  bad JSON/fields/``max_tokens``/context length, 404 unknown model, 429 waiting
  queue full, 503 starting or draining. A client that disconnects is aborted in
  the engine (and, as in vLLM, counted in neither ``vllm:request_success_total`` nor the
  e2e latency histogram).
* ``GET /v1/models``; ``GET /health`` (200, or 503 while starting or draining);
  ``GET /metrics`` (see :mod:`lbtune.sim.metrics`).
* ``GET /debug/requests/{request_id}`` — ground truth of a recent request (any
  replica of this host): wall-clock ``t_arrival``, ``t_headers`` (after the
  headers were written), ``t_first_token`` (first content chunk), ``t_last``
  (last chunk, ``[DONE]`` included), status (499: the client went away), tokens.
* Sim knobs: ``POST /admin/slowdown {"factor": 3.0}`` multiplies step durations
  from now on (1.0 restores); ``POST /admin/drain`` makes ``/health`` and new API
  requests answer 503 while in-flight requests finish; ``POST /admin/ready``
  undoes it; ``POST /admin/crash`` makes the replica die as a crashed process
  would (in-flight connections reset, its port closed, health gone; only a host
  restart brings it back); ``GET /admin/state`` shows state, slowdown, engine load, busy time
  (``busy_s``, and ``sm_active_s``: the same weighted by each step's SM activity)
  and ``modelled_s``/``actual_s``: cumulative modelled step time (already scaled)
  and the wall time the GPU loop actually took for those steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from lbtune import tokens
from lbtune.safety.secrets import Scrubber
from lbtune.sim.engine import (
    Engine,
    EngineConfig,
    InvalidRequest,
    QueueFull,
    SimRequest,
    StepResult,
)
from lbtune.sim.groundtruth import GroundTruthLog, new_record
from lbtune.sim.metrics import ReplicaMetrics
from lbtune.sim.profiles import get_gpu, get_model
from lbtune.sim.responses import Stream, stream_response, whole_response
from lbtune.sim.router_api import add_router_routes
from lbtune.sim.spec import ReplicaSpec
from lbtune.sim.textgen import (
    Api,
    ApiError,
    ParsedRequest,
    Words,
    parse_request,
)

log = logging.getLogger(__name__)
MAX_LAG_S = 0.05
"""How far the GPU loop may fall behind its schedule before it stops catching up."""


class Replica:
    """One simulated GPU with its engine, its HTTP app and its GPU loop."""

    def __init__(
        self,
        spec: ReplicaSpec,
        *,
        time_scale: float = 1.0,
        seed: int = 0,
        ground_truth: GroundTruthLog | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.time_scale = time_scale
        self.seed = seed
        self.gpu = get_gpu(spec.gpu)
        self.model_profiles = {m: get_model(m) for m in spec.models}
        overrides = {
            k: v
            for k in ("max_num_seqs", "max_num_batched_tokens", "max_waiting")
            if (v := getattr(spec, k)) is not None
        }
        self.engine = Engine(
            self.gpu, list(self.model_profiles.values()), EngineConfig(**overrides)
        )
        self.metrics = ReplicaMetrics(spec.models, spec.gpu)
        self.ground_truth = ground_truth if ground_truth is not None else GroundTruthLog()
        self.state = "starting"
        self.slowdown = 1.0
        self.steps = 0
        self.modelled_s = 0.0
        self.actual_s = 0.0
        self.lag_resets = 0
        self._streams: dict[str, Stream] = {}
        self._wake = asyncio.Event()
        self._seq = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._transports: set[asyncio.BaseTransport] = set()
        self.on_crash: Callable[[], Awaitable[None]] | None = None
        """Set by the host: stop listening on this replica's port."""
        self.app = web.Application()
        self.app.add_routes(
            [
                web.post("/v1/chat/completions", self._chat),
                web.post("/v1/completions", self._completions),
                web.get("/v1/models", self._models),
                web.get("/health", self._health),
                web.get("/metrics", self._metrics),
                web.get("/debug/requests/{request_id}", self._debug_request),
                web.post("/admin/slowdown", self._admin_slowdown),
                web.post("/admin/drain", self._admin_drain),
                web.post("/admin/ready", self._admin_ready),
                web.post("/admin/crash", self._admin_crash),
                web.get("/admin/state", self._admin_state),
            ]
        )
        add_router_routes(self.app, self)  # /tokenize, /render, /get_load for vllm-router

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the GPU loop; become ready after ``startup_s``. Needs a running loop."""
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._run_gpu(), name=f"gpu-{self.name}"))
        self._tasks.append(loop.create_task(self._become_ready()))

    async def _become_ready(self) -> None:
        await asyncio.sleep(self.spec.startup_s)
        if self.state == "starting":
            self.state = "ready"

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()

    def admin_state(self) -> dict[str, Any]:
        e = self.engine
        now = time.monotonic()
        return {
            "name": self.name,
            "state": self.state,
            "gpu": self.spec.gpu,
            "models": list(self.spec.models),
            "slowdown": self.slowdown,
            "time_scale": self.time_scale,
            "num_running": e.num_running,
            "num_waiting": e.num_waiting,
            "kv_usage": e.kv_usage,
            "in_flight": len(self._streams),
            "steps": self.steps,
            "modelled_s": self.modelled_s,
            "actual_s": self.actual_s,
            "lag_resets": self.lag_resets,
            "busy_s": self.metrics.busy.busy_seconds(now),
            "sm_active_s": self.metrics.sm_active.seconds(now),
        }

    # ----------------------------------------------------------------- GPU loop

    async def _run_gpu(self) -> None:
        try:
            await self._gpu_loop()
        except Exception:  # a bug: say so, fail health checks, end every response
            log.exception("replica %s: GPU loop crashed", self.name)
            self.state = "failed"
            for st in self._streams.values():
                st.done = True
                st.event.set()

    async def _gpu_loop(self) -> None:
        engine, busy, sm_active = self.engine, self.metrics.busy, self.metrics.sm_active
        while True:
            if not engine.has_work():
                idle_from = time.monotonic()
                busy.stop(idle_from)
                sm_active.set(idle_from, 0.0)
                self._wake.clear()
                await self._wake.wait()
                deadline = last_end = time.monotonic()
                busy.start(last_end)
            step_start = last_end
            res = engine.step()
            sm_active.set(step_start, res.activity)  # over the step's wall time
            dt = res.duration * self.slowdown / self.time_scale
            deadline += dt
            now = time.monotonic()
            if now - deadline > MAX_LAG_S:
                deadline = now
                self.lag_resets += 1
            await asyncio.sleep(max(0.0, deadline - now))
            end = time.monotonic()
            self.steps += 1
            self.modelled_s += dt
            self.actual_s += end - last_end
            last_end = end
            self._deliver(res, step_start, end)

    def _deliver(self, res: StepResult, started: float, now: float) -> None:
        """Hand a finished step's tokens to the responses; observe latency metrics."""
        streams = self._streams
        models = self.metrics.models
        for eid in res.scheduled_first:
            st = streams.get(eid)
            if st is not None and st.queued_at >= 0:
                models[st.model].queue.observe(max(0.0, started - st.queued_at))
                st.queued_at = -1.0
        for eid, new in res.tokens.items():
            st = streams.get(eid)
            if st is None:
                continue
            mm = models[st.model]
            if st.ready == 0:
                mm.ttft.observe(now - st.arrival)
                if new > 1:
                    mm.itl.observe(0.0, new - 1)
            else:
                mm.itl.observe((now - st.last_token_at) / new, new)
            st.ready += new
            st.last_token_at = now
            st.event.set()
        for eid in res.finished:
            st = streams.get(eid)
            if st is not None:
                st.done = True
                st.event.set()

    # ------------------------------------------------------------ API handlers

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "completions")

    async def _complete(self, request: web.Request, api: Api) -> web.StreamResponse:
        t_arrival, arrival = time.time(), time.monotonic()
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        headers = {"x-request-id": rid, "x-sim-replica": self.name}
        gt = new_record(rid, self.name, api, t_arrival)
        # What this request's client sent as its key is scrubbed from what is logged of it.
        scrub = Scrubber(_bearer(request.headers.get("Authorization", "")))
        if request.transport is not None:
            self._transports.add(request.transport)
        try:
            if self.state != "ready":
                raise ApiError(503, f"replica {self.name} is {self.state}")
            try:
                body = json.loads(await request.read())
            except (ValueError, UnicodeDecodeError) as exc:
                raise ApiError(400, f"malformed JSON body: {exc}") from None
            p = parse_request(api, body, self.spec.models, self._context_length, self.seed)
            gt.update(model=p.model, stream=p.stream, prompt_tokens=len(p.prompt_ids))
            await asyncio.sleep(self.gpu.request_overhead_s / self.time_scale)
            eid, st = self._admit(p, arrival)
        except ApiError as err:
            resp = web.json_response(err.body(), status=err.status, headers=headers)
            await resp.prepare(request)
            await resp.write_eof()
            gt.update(status=err.status, error=err.message, t_headers=time.time())
            gt["t_last"] = gt["t_headers"]
            self.ground_truth.record(gt, scrub)
            return resp
        try:
            if p.stream:
                return await stream_response(request, p, st, rid, headers, gt)
            return await whole_response(request, p, st, rid, headers, gt)
        except asyncio.CancelledError:  # the client went away before its response
            gt.update(status=499, error="client disconnected")
            raise
        finally:
            if request.transport is not None:
                self._transports.discard(request.transport)
            self._streams.pop(eid, None)
            if not st.done:
                self.engine.abort(eid)
            mm = self.metrics.models[p.model]
            reason = p.finish_reason if st.done else "abort"
            if st.done:  # vLLM counts neither for a request its client aborted
                mm.success[reason] += 1
                mm.e2e.observe(time.monotonic() - arrival)
            gt.update(output_tokens=st.ready, finish_reason=reason)
            self.ground_truth.record(gt, scrub)

    def _context_length(self, model: str) -> int:
        return self.model_profiles[model].context_length

    def _admit(self, p: ParsedRequest, arrival: float) -> tuple[str, Stream]:
        if self.state != "ready":
            raise ApiError(503, f"replica {self.name} is {self.state}")
        self._seq += 1
        eid = f"{self._seq}"
        words = Words(p.text_seed).take(p.output_tokens)
        st = Stream(p.model, words, arrival)
        out_ids = [tokens.token_id(w[1:]) for w in words]
        req = SimRequest(eid, p.model, p.prompt_ids, p.output_tokens, arrival, out_ids)
        try:
            self.engine.add_request(req)
        except QueueFull:
            raise ApiError(429, f"replica {self.name}: waiting queue is full") from None
        except InvalidRequest as exc:
            raise ApiError(400, str(exc), "messages" if p.api == "chat" else "prompt") from None
        self._streams[eid] = st
        self._wake.set()
        return eid, st

    # ------------------------------------------------------- other endpoints

    async def _models(self, request: web.Request) -> web.Response:
        data = [
            {
                "id": m,
                "object": "model",
                "created": 0,
                "owned_by": "lbtune-sim",
                "root": m,
                "max_model_len": p.context_length,
            }
            for m, p in self.model_profiles.items()
        ]
        return web.json_response({"object": "list", "data": data})

    async def _health(self, request: web.Request) -> web.Response:
        if self.state == "ready":
            return web.Response(status=200)
        err = ApiError(503, f"replica {self.name} is {self.state}")
        return web.json_response(err.body(), status=503)

    async def _metrics(self, request: web.Request) -> web.Response:
        text = self.metrics.render(self.engine)
        return web.Response(
            text=text,
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Prometheus-Format": "0.0.4"},
        )

    async def _debug_request(self, request: web.Request) -> web.Response:
        rec = self.ground_truth.get(request.match_info["request_id"])
        if rec is None:
            return web.json_response(ApiError(404, "unknown request id").body(), status=404)
        return web.json_response(rec)

    async def _admin_slowdown(self, request: web.Request) -> web.Response:
        try:
            factor = (await request.json())["factor"]
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            err = ApiError(400, 'expected {"factor": <number > 0>}', "factor")
            return web.json_response(err.body(), status=400)
        self.slowdown = float(factor)
        return web.json_response(self.admin_state())

    async def _admin_drain(self, request: web.Request) -> web.Response:
        self.state = "draining"
        return web.json_response(self.admin_state())

    async def _admin_ready(self, request: web.Request) -> web.Response:
        self.state = "ready"
        return web.json_response(self.admin_state())

    async def _admin_crash(self, request: web.Request) -> web.Response:
        asyncio.get_running_loop().call_soon(
            lambda: self._tasks.append(asyncio.ensure_future(self.crash()))
        )
        return web.json_response({"name": self.name, "state": "crashing"})

    async def crash(self) -> None:
        """Die like a killed process: reset connections, close the port, stop the GPU."""
        self.state = "crashed"
        for tr in list(self._transports):
            tr.abort()  # type: ignore[attr-defined]
        self._transports.clear()
        if self.on_crash is not None:
            await self.on_crash()
        for t in self._tasks:
            if t is not asyncio.current_task():
                t.cancel()

    async def _admin_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.admin_state())


def _bearer(header: str) -> list[str]:
    """The token of an ``Authorization: Bearer TOKEN`` header (none: an empty list)."""
    scheme, _, token = header.strip().partition(" ")
    return [token.strip()] if scheme.lower() == "bearer" and token.strip() else []
