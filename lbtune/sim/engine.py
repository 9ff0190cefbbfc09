"""Continuous-batching engine modelled on vLLM v1's scheduler (pure, no I/O, no clock).

Each :meth:`Engine.step` schedules one batch and returns how long it takes on the real GPU
(:class:`StepResult.duration`); the caller sleeps ``duration / time_scale`` and streams the
tokens the step produced. Scheduling, as in ``vllm/v1/core/sched/scheduler.py``:

1. RUNNING requests in admission order, each ``min(tokens still to compute, budget)``: one
   token for a decoding request, the next chunk for a request whose prefill is unfinished.
   Prefilling requests are the most recently admitted, so decodes go first. When a request
   needs a new KV block and none is free, the most recently admitted running request is
   preempted (recompute: blocks freed, back to the FRONT of the queue, tokens it already
   produced kept but recomputed as prompt) until the allocation succeeds or the request
   preempted itself.
2. If nothing was preempted: WAITING requests FIFO while budget, ``max_num_seqs`` and free
   blocks allow, each after a prefix-cache lookup (at least the last token is recomputed).
   A request that does not fit blocks the queue (head-of-line, as vLLM's FCFS policy).

A step that completes a request's prefill (or recompute) yields its next token.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lbtune.errors import ConfigError
from lbtune.sim import costmodel
from lbtune.sim.batch import BatchLoad
from lbtune.sim.kvcache import Block, KVCache, hash_block
from lbtune.sim.profiles import GpuProfile, ModelProfile

StepCostFn = Callable[[BatchLoad], costmodel.StepCost]
"""A step's cost from its batch, where it is not the GPU profile's roofline (a replica
fitted from measurements: :mod:`lbtune.twin.fitted`)."""


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    """Token budget of one step (chunked prefill)."""
    block_size: int = 16
    gpu_memory_utilization: float = 0.90
    max_waiting: int = 1024
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    """Cap on prompt + output tokens (vLLM ``--max-model-len``); the model's own when None."""


class QueueFull(Exception):
    """The waiting queue holds ``max_waiting`` requests (the server answers 429)."""


class InvalidRequest(ValueError):
    """The request can never be served as given (the server answers 400)."""


class RequestTooLong(InvalidRequest):
    """Prompt + max_tokens beyond the context length, or more KV than the whole cache."""


class UnknownModel(KeyError):
    """The model is not served by this engine (the server answers 404)."""


@dataclass
class SimRequest:
    request_id: str
    model: str
    prompt_token_ids: list[int]
    max_tokens: int
    """EXACT number of tokens to generate."""
    arrival_time: float = 0.0
    output_token_ids: list[int] | None = None
    """Token ids of the text the server will stream, if known: used for prefix-cache hashing
    of generated tokens (multi-turn chats resend them). Synthetic unique ids otherwise."""


@dataclass(frozen=True)
class StepResult:
    duration: float
    """Seconds this step takes on the real GPU (time scale 1); 0 when idle."""
    tokens: dict[str, int]
    """request_id -> number of NEW output tokens produced at the end of this step (1)."""
    finished: tuple[str, ...]
    """Requests that produced their last token in this step (their KV is freed)."""
    preempted: tuple[str, ...]
    """Requests preempted (recompute) in this step."""
    num_prefill_tokens: int
    num_decode_tokens: int
    batch_size: int
    scheduled_first: tuple[str, ...] = ()
    """Requests scheduled for the first time (they left the queue: queue time ends here)."""
    num_cached_tokens: dict[str, int] = field(default_factory=dict)
    """request_id -> prompt tokens served from the prefix cache, at its first scheduling."""
    compute_s: float = 0.0
    """Seconds of ``duration`` the SMs spend on arithmetic (GEMMs and attention), see
    :func:`lbtune.sim.costmodel.step_cost`."""

    @property
    def activity(self) -> float:
        """SM activity of this step: ``compute_s / duration`` in 0..1, 0 when idle."""
        return costmodel.StepCost(self.duration, self.compute_s).activity


@dataclass
class EngineStats:
    """Monotonic counters (vLLM's ``*_total`` metrics)."""

    prefix_cache_queries: int = 0
    """Tokens looked up in the prefix cache (prompt tokens of requests admitted)."""
    prefix_cache_hits: int = 0
    """Tokens found in the prefix cache."""
    num_preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0


class _Req:
    """Engine-side state of one request."""

    __slots__ = (
        "blocks",
        "hashes",
        "max_tokens",
        "model",
        "num_computed",
        "num_output",
        "num_prompt",
        "output_ids",
        "req",
        "scheduled_once",
        "serial",
        "tokens",
    )

    def __init__(self, req: SimRequest, model: int, serial: int) -> None:
        self.req = req
        self.model = model
        self.serial = serial
        self.tokens: list[int] = list(req.prompt_token_ids)
        self.num_prompt = len(self.tokens)
        self.max_tokens = req.max_tokens
        self.output_ids = req.output_token_ids
        self.num_output = 0
        self.num_computed = 0
        self.blocks: list[Block] = []
        self.hashes: list[int] = []
        self.scheduled_once = False

    def next_output_id(self) -> int:
        i = self.num_output
        if self.output_ids is not None and i < len(self.output_ids):
            return self.output_ids[i]
        return -((self.serial << 24) + i + 1)  # negative: never equal to a real token id


class Engine:
    """One simulated GPU running one scheduler over one KV pool, serving ``models``."""

    def __init__(
        self,
        gpu: GpuProfile,
        models: Sequence[ModelProfile],
        config: EngineConfig = EngineConfig(),
        step_cost: StepCostFn | None = None,
    ) -> None:
        if not models:
            raise ConfigError("An engine needs at least one model")
        self.gpu = gpu
        self._step_cost = step_cost
        self.models = tuple(models)
        self.config = config
        self._model_index = {m.name: i for i, m in enumerate(self.models)}
        self.weight_bytes = sum(m.weight_bytes for m in self.models)
        budget = int(gpu.memory_bytes * config.gpu_memory_utilization)
        kv_bytes = budget - self.weight_bytes
        block_bytes = [config.block_size * m.kv_bytes_per_token for m in self.models]
        if kv_bytes < max(block_bytes):
            names = ", ".join(m.name for m in self.models)
            raise ConfigError(
                f"Models {names} ({self.weight_bytes / 1e9:.1f} GB of weights) do not fit on "
                f"{gpu.name} ({budget / 1e9:.1f} GB usable at gpu_memory_utilization "
                f"{config.gpu_memory_utilization}). Serve fewer or smaller models there."
            )
        self.kv = KVCache(kv_bytes, block_bytes, config.enable_prefix_caching)
        self.stats = EngineStats()
        self.model_stats: dict[str, EngineStats] = {m.name: EngineStats() for m in self.models}
        """The same counters per served model (the ``model_name`` label)."""
        self._mstats = [self.model_stats[m.name] for m in self.models]
        self._running: list[_Req] = []
        self._waiting: deque[_Req] = deque()
        self._requests: dict[str, _Req] = {}
        self._serial = 0

    # --- properties --------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_usage(self) -> float:
        """Fraction 0..1 of the KV cache in use (vLLM's ``kv_cache_usage_perc``)."""
        return self.kv.usage

    @property
    def kv_capacity_blocks(self) -> int:
        """Capacity in blocks of the first served model (8B-equivalent units when it is the
        8B model): the pool is a byte budget, a bigger model's block takes more of it."""
        return self.kv.capacity_bytes // self.kv.block_bytes[0]

    @property
    def kv_capacity_bytes(self) -> int:
        return self.kv.capacity_bytes

    @property
    def memory_used_bytes(self) -> int:
        """Weights of every served model + KV blocks in use."""
        return self.weight_bytes + self.kv.used_bytes

    @property
    def memory_total_bytes(self) -> int:
        return self.gpu.memory_bytes

    @property
    def max_model_len(self) -> dict[str, int]:
        cap = self.config.max_model_len
        return {
            m.name: m.context_length if cap is None else min(cap, m.context_length)
            for m in self.models
        }

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    # --- requests ----------------------------------------------------------------------------

    def add_request(self, req: SimRequest) -> None:
        """Queue ``req``. Raises UnknownModel, InvalidRequest/RequestTooLong or QueueFull."""
        model = self._model_index.get(req.model)
        if model is None:
            served = ", ".join(m.name for m in self.models)
            raise UnknownModel(f"Model {req.model!r} is not served here. Served: {served}")
        if req.request_id in self._requests:
            raise InvalidRequest(f"Duplicate request id {req.request_id!r}")
        n_prompt = len(req.prompt_token_ids)
        if n_prompt < 1:
            raise InvalidRequest("The prompt must contain at least one token")
        if req.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be at least 1, got {req.max_tokens}")
        limit = self.max_model_len[req.model]
        total = n_prompt + req.max_tokens
        if total > limit:
            raise RequestTooLong(
                f"This model's maximum context length is {limit} tokens, but {total} were "
                f"requested ({n_prompt} in the prompt, {req.max_tokens} to generate)"
            )
        bs = self.config.block_size
        if -(-total // bs) * self.kv.block_bytes[model] > self.kv.capacity_bytes:
            raise RequestTooLong(
                f"{total} tokens need more KV cache than this replica has "
                f"({self.kv.capacity_bytes // (self.kv.block_bytes[model] // bs)} tokens)"
            )
        if len(self._waiting) >= self.config.max_waiting:
            raise QueueFull(f"{len(self._waiting)} requests are waiting already")
        self._serial += 1
        r = _Req(req, model, self._serial)
        self._requests[req.request_id] = r
        self._waiting.append(r)

    def abort(self, request_id: str) -> None:
        """Forget a request (client went away) and free its blocks; unknown ids are ignored."""
        r = self._requests.pop(request_id, None)
        if r is None:
            return
        if r.blocks:
            self.kv.free(r.blocks)
            r.blocks = []
        if r in self._waiting:
            self._waiting.remove(r)
        else:
            self._running.remove(r)

    # --- scheduling --------------------------------------------------------------------------

    def _block_hashes(self, r: _Req, num_full: int) -> list[int]:
        """Hashes of the first ``num_full`` full blocks of ``r``'s tokens (memoised)."""
        hashes = r.hashes
        bs = self.config.block_size
        while len(hashes) < num_full:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block(parent, r.model, r.tokens[i * bs : (i + 1) * bs]))
        return hashes

    def _preempt(self, r: _Req) -> None:
        self.kv.free(r.blocks)
        r.blocks = []
        r.num_computed = 0
        self._waiting.appendleft(r)
        self.stats.num_preemptions += 1
        self._mstats[r.model].num_preemptions += 1

    def step(self) -> StepResult:
        """Schedule one batch, advance every scheduled request, and say how long it took."""
        cfg = self.config
        bs = cfg.block_size
        kv = self.kv
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[_Req, int]] = []  # (request, new tokens)
        preempted: list[str] = []
        running = self._running

        # 1. running requests, in admission order
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = min(len(r.tokens) - r.num_computed, budget)
            need = -(-(r.num_computed + n) // bs) - len(r.blocks)
            preempted_self = False
            while need > 0 and not kv.can_allocate(r.model, need):
                victim = running.pop()  # the most recently admitted
                self._preempt(victim)
                preempted.append(victim.req.request_id)
                if victim is r:
                    preempted_self = True
                    break
            if preempted_self:
                break
            if need > 0:
                r.blocks.extend(kv.allocate(r.model, need))
            scheduled.append((r, n))
            budget -= n
            i += 1

        # 2. waiting requests, FIFO, only when nothing was preempted
        first: list[str] = []
        cached_tokens: dict[str, int] = {}
        waiting = self._waiting
        while not preempted and waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            r = waiting[0]
            num_tokens = len(r.tokens)
            hit: list[Block] = []
            if kv.enable_prefix_caching:
                # vLLM always recomputes at least the last token: only blocks within n-1.
                hit = kv.find_hit(self._block_hashes(r, (num_tokens - 1) // bs))
            hit_tokens = len(hit) * bs
            n = min(num_tokens - hit_tokens, budget)
            need = -(-(hit_tokens + n) // bs) - len(hit)
            if not kv.can_allocate(r.model, need, hit):
                break
            waiting.popleft()
            kv.touch(hit)
            r.blocks = hit + kv.allocate(r.model, need)
            r.num_computed = hit_tokens
            stats = self._mstats[r.model]
            for s in (self.stats, stats):
                s.prefix_cache_queries += num_tokens
                s.prefix_cache_hits += hit_tokens
            if not r.scheduled_once:
                r.scheduled_once = True
                first.append(r.req.request_id)
                cached_tokens[r.req.request_id] = hit_tokens
            running.append(r)
            scheduled.append((r, n))
            budget -= n

        return self._advance(scheduled, preempted, first, cached_tokens)

    def _advance(
        self,
        scheduled: list[tuple[_Req, int]],
        preempted: list[str],
        first: list[str],
        cached_tokens: dict[str, int],
    ) -> StepResult:
        """Cost the batch, then move every scheduled request forward by its tokens."""
        load = BatchLoad(len(self.models))
        out: dict[str, int] = {}
        finished: list[str] = []
        for r, n in scheduled:
            c0 = r.num_computed
            load.add(r.model, c0, n, decode=n == 1 and r.num_output > 0 and c0 == len(r.tokens) - 1)
            r.num_computed = c0 + n
            if self.kv.enable_prefix_caching:
                self._cache_computed_blocks(r, c0)
            if r.num_computed == len(r.tokens):  # all known tokens computed: sample one
                out[r.req.request_id] = 1
                if self._sample(r):
                    finished.append(r.req.request_id)
        if finished:
            self._free(finished)
        cost = (
            costmodel.step_cost(self.gpu, load.shares(self.models))
            if self._step_cost is None
            else self._step_cost(load)
        )
        return StepResult(
            duration=cost.duration,
            tokens=out,
            finished=tuple(finished),
            preempted=tuple(preempted),
            num_prefill_tokens=load.prefill_tokens,
            num_decode_tokens=load.decode_tokens,
            batch_size=len(scheduled),
            scheduled_first=tuple(first),
            num_cached_tokens=cached_tokens,
            compute_s=cost.compute_s,
        )

    def _cache_computed_blocks(self, r: _Req, computed_before: int) -> None:
        """Enter the blocks this step filled into the prefix cache."""
        bs = self.config.block_size
        full = r.num_computed // bs
        if full > computed_before // bs:
            hashes = self._block_hashes(r, full)
            for b in range(computed_before // bs, full):
                self.kv.cache_block(r.blocks[b], hashes[b])

    def _sample(self, r: _Req) -> bool:
        """Append the request's next output token; True when that was its last."""
        stats = self._mstats[r.model]
        if r.num_output == 0:
            self.stats.prompt_tokens += r.num_prompt
            stats.prompt_tokens += r.num_prompt
        r.tokens.append(r.next_output_id())
        r.num_output += 1
        self.stats.generation_tokens += 1
        stats.generation_tokens += 1
        if r.num_output < r.max_tokens:
            return False
        self.stats.requests_finished += 1
        stats.requests_finished += 1
        return True

    def _free(self, finished: list[str]) -> None:
        """Release the finished requests' KV blocks and take them off the running list."""
        for rid in finished:
            r = self._requests.pop(rid)
            self.kv.free(r.blocks)
            r.blocks = []
        done = set(finished)
        self._running = [r for r in self._running if r.req.request_id not in done]
