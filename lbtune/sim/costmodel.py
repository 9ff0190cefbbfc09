"""How long one engine step takes on one GPU: pure functions, no state.

One step runs a batch of requests; for each served model ``m`` its share of the batch is a
:class:`ModelLoad` (tokens computed, requests sampled, KV tokens read, attention pairs). Each
share costs four terms, and the step pays a small host overhead once::

    step = step_overhead + sum over models m of
        linear_m      roof(W_lin / BW_eff,  2 P_lin tokens / F_eff)        decoder GEMMs
      + lm_head_m     roof(W_lm / BW_eff,   2 P_lm rows / F_eff)           sampled rows only
      + elementwise_m L roof(floor_e,  tokens B_e / (L BW_elem))            norms, RoPE, SiLU, add
      + attention_m   L roof(floor_a, ((kv_read + rows T_seq) B_kv / BW_attn
                                      + (prefix_pairs / F_attn + causal_pairs / F_causal) f) / L)

where a prefill chunk's (query, key) pairs split into those against earlier tokens
(``prefix_pairs``, full tiles) and the causal triangle among its own tokens (``causal_pairs``,
masked tiles, a third of the speed as profiled); a decode's attention is bound by its KV reads
plus a fixed ``T_seq`` tokens' worth per request (the kernel's per-sequence work: query load,
block table, softmax epilogue, output write), so that its growth with context does not depend
on the batch, as profiled; and ``roof(a, b) = sqrt(a**2 + b**2)`` is a smooth
roofline: equal to the larger term far from the ridge, ~41 % above it on the ridge, where GEMMs
reach neither their bandwidth nor their FLOP roof. Attention adds its KV reads and its
arithmetic, so the decodes of a mixed chunked-prefill step pay for their KV even when the
chunk's GEMMs are compute bound. The
embedding lookup is elementwise traffic (one row per token), never a GEMM. See
``docs/simulator.md`` for every constant and ``benchmarks/sim_calibration.py`` for the check.

The arithmetic part of a step (the GEMMs' and attention's FLOP time, whether or not memory
hides it) over the step's time is the step's *SM activity* (:func:`step_cost`), what the server
exports as ``DCGM_FI_PROF_SM_ACTIVE``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from lbtune.sim.profiles import GpuProfile, ModelProfile


@dataclass(frozen=True)
class ModelLoad:
    """One model's share of a step."""

    tokens: int
    """Tokens whose KV is computed in this step (prefill chunk tokens + one per decode)."""
    kv_read_tokens: int = 0
    """KV tokens read by attention: per request, its context including the new tokens."""
    attn_pairs: float = 0.0
    """(query, key) pairs attended: per request ``q * c0 + q * (q + 1) / 2`` for ``q`` new
    tokens after ``c0`` cached ones."""
    decode_pairs: float = 0.0
    """The part of ``attn_pairs`` from one-token queries (decodes): their attention is bound
    by the KV reads, its arithmetic hides under them."""
    causal_pairs: float = 0.0
    """The part of ``attn_pairs`` inside multi-token chunks' causal triangles
    (``q * (q + 1) / 2`` per chunk); the rest of a chunk's pairs face earlier tokens."""
    rows: int = 1
    """Requests in the share: the LM head runs on one row per request (vLLM computes logits
    at each scheduled request's last position), not on every token."""


def request_load(computed: int, new_tokens: int) -> ModelLoad:
    """The load of one request computing ``new_tokens`` after ``computed`` cached tokens."""
    q = new_tokens
    pairs = q * computed + q * (q + 1) / 2
    return ModelLoad(
        tokens=q,
        kv_read_tokens=computed + q,
        attn_pairs=pairs,
        decode_pairs=pairs if q == 1 else 0.0,
        causal_pairs=0.0 if q == 1 else q * (q + 1) / 2,
        rows=1,
    )


def roof(memory_s: float, compute_s: float) -> float:
    """Smooth roofline: ``sqrt(memory**2 + compute**2)``, never below either term."""
    return math.hypot(memory_s, compute_s)


# --- the terms (seconds), each a pure function of the profiles and a count ------------------


def linear_compute_time(gpu: GpuProfile, model: ModelProfile, tokens: int) -> float:
    """FLOP time of the decoder GEMMs for ``tokens`` tokens at the GEMM roof."""
    return 2.0 * model.linear_params * tokens / gpu.effective_flops


def linear_time(gpu: GpuProfile, model: ModelProfile, tokens: int) -> float:
    """Decoder GEMMs (QKV, O, gate/up, down of every layer) for ``tokens`` tokens: their
    weights streamed once, their FLOPs, on the smooth roofline. 0 for no tokens."""
    if tokens <= 0:
        return 0.0
    memory = model.linear_bytes / gpu.effective_bandwidth
    return roof(memory, linear_compute_time(gpu, model, tokens))


def lm_head_compute_time(gpu: GpuProfile, model: ModelProfile, rows: int) -> float:
    """FLOP time of the LM head for ``rows`` sampled rows."""
    return 2.0 * model.lm_head_params * rows / gpu.effective_flops


def lm_head_time(gpu: GpuProfile, model: ModelProfile, rows: int) -> float:
    """LM head on ``rows`` rows: its weights streamed once, ``2 x vocab x hidden`` FLOPs a row."""
    if rows <= 0:
        return 0.0
    memory = model.lm_head_bytes / gpu.effective_bandwidth
    return roof(memory, lm_head_compute_time(gpu, model, rows))


def elementwise_time(gpu: GpuProfile, model: ModelProfile, tokens: int) -> float:
    """Norms, RoPE, SiLU-and-multiply, residual adds and the embedding lookup for ``tokens``
    tokens: per layer, the kernels' latency floor and their activation traffic on the smooth
    roofline (memory bound, no FLOP roof)."""
    if tokens <= 0:
        return 0.0
    traffic = tokens * model.elementwise_bytes_per_token / gpu.elementwise_bandwidth
    return model.n_layers * roof(gpu.elementwise_floor_s, traffic / model.n_layers)


def attention_compute_time(
    gpu: GpuProfile, model: ModelProfile, pairs: float, causal_pairs: float = 0.0
) -> float:
    """FLOP time of QK^T and AV for ``pairs`` (query, key) pairs against earlier tokens and
    ``causal_pairs`` inside causal triangles."""
    f = model.attn_flops_per_pair
    return pairs * f / gpu.effective_attn_flops + causal_pairs * f / gpu.effective_causal_flops


def attention_time(
    gpu: GpuProfile,
    model: ModelProfile,
    kv_read_tokens: int,
    pairs: float,
    causal_pairs: float = 0.0,
    *,
    seqs: int,
) -> float:
    """Attention over the batch of ``seqs`` requests: every request's KV read once plus its
    fixed per-sequence work (what decodes pay), plus the arithmetic of the prefill chunks'
    ``pairs`` against earlier tokens and ``causal_pairs`` among their own (what long prompts
    pay; decodes' pairs are not passed), per layer on the smooth roofline with the kernel's
    latency floor."""
    if kv_read_tokens <= 0 and pairs <= 0 and causal_pairs <= 0:
        return 0.0
    kv = kv_read_tokens + seqs * gpu.attn_seq_tokens
    memory = kv * model.kv_bytes_per_token / gpu.effective_attn_bandwidth
    work = memory + attention_compute_time(gpu, model, pairs, causal_pairs)
    return model.n_layers * roof(gpu.attn_floor_s, work / model.n_layers)


@dataclass(frozen=True)
class Breakdown:
    """One model's share of a step, term by term (seconds)."""

    linear: float
    lm_head: float
    elementwise: float
    attention: float
    compute: float
    """Arithmetic seconds inside the terms above (GEMM and attention FLOPs at their roofs)."""

    @property
    def total(self) -> float:
        return self.linear + self.lm_head + self.elementwise + self.attention


def breakdown(gpu: GpuProfile, model: ModelProfile, load: ModelLoad) -> Breakdown:
    """Every term of one model's share of a step (all 0 for a share without tokens)."""
    if load.tokens <= 0:
        return Breakdown(0.0, 0.0, 0.0, 0.0, 0.0)
    rows = max(1, load.rows)
    causal = load.causal_pairs
    prefix = max(0.0, load.attn_pairs - load.decode_pairs - causal)
    compute = (
        linear_compute_time(gpu, model, load.tokens)
        + lm_head_compute_time(gpu, model, rows)
        + attention_compute_time(gpu, model, prefix, causal)
    )
    return Breakdown(
        linear=linear_time(gpu, model, load.tokens),
        lm_head=lm_head_time(gpu, model, rows),
        elementwise=elementwise_time(gpu, model, load.tokens),
        attention=attention_time(gpu, model, load.kv_read_tokens, prefix, causal, seqs=rows),
        compute=compute,
    )


def model_time(gpu: GpuProfile, model: ModelProfile, load: ModelLoad) -> float:
    """Seconds one model's share of a step costs, without the per-step overhead."""
    return breakdown(gpu, model, load).total


def compute_time(gpu: GpuProfile, model: ModelProfile, load: ModelLoad) -> float:
    """Seconds of arithmetic in one model's share of a step: GEMM and attention FLOPs at their
    roofs (also when memory hides them). At most :func:`model_time`."""
    return breakdown(gpu, model, load).compute


@dataclass(frozen=True)
class StepCost:
    """What one step costs: its time, and how much of it the SMs spend on arithmetic."""

    duration: float
    """Seconds of the step (0 when idle)."""
    compute_s: float
    """Seconds of arithmetic in it (:func:`compute_time` summed over models), <= duration."""

    @property
    def activity(self) -> float:
        """``compute_s / duration`` in 0..1 (0 for an idle step): the step's SM activity."""
        if self.duration <= 0.0:
            return 0.0
        return min(1.0, self.compute_s / self.duration)


def step_cost(gpu: GpuProfile, shares: Iterable[tuple[ModelProfile, ModelLoad]]) -> StepCost:
    """Time and arithmetic of one step: the host overhead once, plus each model's share.

    A step with no tokens at all takes no time (the engine is idle).
    """
    total = compute = 0.0
    busy = False
    for model, load in shares:
        if load.tokens > 0:
            busy = True
            b = breakdown(gpu, model, load)
            total += b.total
            compute += b.compute
    if not busy:
        return StepCost(0.0, 0.0)
    return StepCost(gpu.step_overhead_s + total, compute)


def step_time(gpu: GpuProfile, shares: Iterable[tuple[ModelProfile, ModelLoad]]) -> float:
    """Seconds of one step (:func:`step_cost`'s duration); 0 when no share has tokens."""
    return step_cost(gpu, shares).duration


def request_overhead_s(gpu: GpuProfile, model: ModelProfile) -> float:
    """Fixed front-end time per request (API server, tokenisation, detokenisation).

    The server adds it once to every request's time to first token; the engine never sees it.
    It depends on the host, not on the model, in this model.
    """
    del model
    return gpu.request_overhead_s


# --- reference figures (calibration, docs and tests) ----------------------------------------


def decode_batch_load(batch: int, context_tokens: int) -> ModelLoad:
    """``batch`` decodes, each with ``context_tokens`` tokens of KV already computed."""
    return ModelLoad(
        tokens=batch,
        kv_read_tokens=batch * (context_tokens + 1),
        attn_pairs=float(batch * (context_tokens + 1)),
        decode_pairs=float(batch * (context_tokens + 1)),
        rows=batch,
    )


def mixed_load(chunk_tokens: int, decodes: int, context_tokens: int) -> ModelLoad:
    """A chunked-prefill step: one fresh ``chunk_tokens`` chunk plus ``decodes`` decodes."""
    chunk = request_load(0, chunk_tokens)
    dec = decode_batch_load(decodes, context_tokens)
    return ModelLoad(
        tokens=chunk.tokens + dec.tokens,
        kv_read_tokens=chunk.kv_read_tokens + dec.kv_read_tokens,
        attn_pairs=chunk.attn_pairs + dec.attn_pairs,
        decode_pairs=dec.decode_pairs,
        causal_pairs=chunk.causal_pairs,
        rows=1 + decodes,
    )


def prefill_step_time(gpu: GpuProfile, model: ModelProfile, prompt_tokens: int) -> float:
    """One step prefilling a whole ``prompt_tokens`` prompt alone (no cache hit)."""
    return step_time(gpu, [(model, request_load(0, prompt_tokens))])


def decode_step_time(
    gpu: GpuProfile, model: ModelProfile, context_tokens: int, batch: int = 1
) -> float:
    """One decode step of ``batch`` requests whose KV already holds ``context_tokens`` each."""
    return step_time(gpu, [(model, decode_batch_load(batch, context_tokens))])


def ttft_batch1(gpu: GpuProfile, model: ModelProfile, prompt_tokens: int) -> float:
    """Time to first token of a lone request whose prompt fits one step's token budget."""
    return request_overhead_s(gpu, model) + prefill_step_time(gpu, model, prompt_tokens)


def prefill_ms_per_token(gpu: GpuProfile, model: ModelProfile, prompt_tokens: int) -> float:
    """TTFT per prompt token at batch 1, in milliseconds (how public tables quote it)."""
    return 1000.0 * ttft_batch1(gpu, model, prompt_tokens) / prompt_tokens


@dataclass(frozen=True)
class EngineRates:
    """A replica's engine in four numbers (model seconds, time scale 1): what a scheduler
    needs to predict a request's time to first token and time per output token there."""

    prefill_tokens_per_s: float
    """Prompt tokens prefilled per second in full chunks (no cache hit)."""
    step_s: float
    """One decode step of a lone request."""
    step_per_seq_s: float
    """What each further running request adds to a decode step."""
    request_overhead_s: float
    """Fixed front-end time per request (:func:`request_overhead_s`)."""


RATE_CONTEXT_TOKENS = 1024
"""The context the decode rates are taken at (a typical chat request's prompt + output)."""
RATE_BATCH = 32
"""The batch whose decode step sets the per-request slope."""


def engine_rates(
    gpu: GpuProfile,
    model: ModelProfile,
    chunk_tokens: int = 2048,
    context_tokens: int = RATE_CONTEXT_TOKENS,
) -> EngineRates:
    """:class:`EngineRates` of ``model`` on ``gpu``: prefill at one ``chunk_tokens`` chunk a
    step, decode steps at ``context_tokens`` of context, alone and at :data:`RATE_BATCH`
    (the line through both; the step grows about linearly with the batch's KV reads)."""
    one = decode_step_time(gpu, model, context_tokens, 1)
    many = decode_step_time(gpu, model, context_tokens, RATE_BATCH)
    return EngineRates(
        prefill_tokens_per_s=chunk_tokens / prefill_step_time(gpu, model, chunk_tokens),
        step_s=one,
        step_per_seq_s=(many - one) / (RATE_BATCH - 1),
        request_overhead_s=request_overhead_s(gpu, model),
    )
