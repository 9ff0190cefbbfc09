"""How long one engine step takes on one GPU: pure functions, no state.

One step runs a batch of requests; for each served model ``m`` its share of the batch is a
:class:`ModelLoad` (tokens computed, KV tokens read by attention, attention pairs). Then::

    step = step_overhead
         + sum over models m of
             max( (weights_m + kv_read_m * kv_bytes_per_token_m) / effective_bandwidth,
                  2 * params_m * tokens_m / effective_flops )
             + attn_pairs_m * 4 * layers_m * hidden_m / effective_attn_flops

The first term of the ``max`` is the memory-bound floor (every step streams all weights once,
and attention reads the KV of every token it attends to); the second is the compute of the
linear layers; the last term is the attention arithmetic, quadratic in a prompt's length.
See ``docs/simulator.md`` for the calibration.

The arithmetic part of a step (the linear layers' compute, whether or not it hides under the
memory floor, plus the attention term) over the step's time is the step's *SM activity*
(:func:`step_cost`), what the server exports as ``DCGM_FI_PROF_SM_ACTIVE``.
"""

from __future__ import annotations

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


def request_load(computed: int, new_tokens: int) -> ModelLoad:
    """The load of one request computing ``new_tokens`` after ``computed`` cached tokens."""
    q = new_tokens
    return ModelLoad(
        tokens=q, kv_read_tokens=computed + q, attn_pairs=q * computed + q * (q + 1) / 2
    )


def linear_time(gpu: GpuProfile, model: ModelProfile, tokens: int) -> float:
    """Seconds of the linear layers (weights streamed, GEMMs) for ``tokens`` tokens."""
    memory = model.weight_bytes / gpu.effective_bandwidth
    compute = 2.0 * model.params * tokens / gpu.effective_flops
    return max(memory, compute)


def model_time(gpu: GpuProfile, model: ModelProfile, load: ModelLoad) -> float:
    """Seconds one model's share of a step costs, without the per-step overhead."""
    if load.tokens <= 0:
        return 0.0
    memory = (
        model.weight_bytes + load.kv_read_tokens * model.kv_bytes_per_token
    ) / gpu.effective_bandwidth
    compute = 2.0 * model.params * load.tokens / gpu.effective_flops
    attention = load.attn_pairs * model.attn_flops_per_pair / gpu.effective_attn_flops
    return max(memory, compute) + attention


def compute_time(gpu: GpuProfile, model: ModelProfile, load: ModelLoad) -> float:
    """Seconds of arithmetic in one model's share of a step: the linear layers' FLOPs (also
    when the memory floor hides them) plus the attention term. At most :func:`model_time`."""
    if load.tokens <= 0:
        return 0.0
    linear = 2.0 * model.params * load.tokens / gpu.effective_flops
    return linear + load.attn_pairs * model.attn_flops_per_pair / gpu.effective_attn_flops


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
    """Time and arithmetic of one step: the fixed overhead once, plus each model's share.

    A step with no tokens at all takes no time (the engine is idle).
    """
    total = compute = 0.0
    busy = False
    for model, load in shares:
        if load.tokens > 0:
            busy = True
            total += model_time(gpu, model, load)
            compute += compute_time(gpu, model, load)
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


# --- batch-1 reference figures (calibration, docs and tests) -------------------------------


def prefill_step_time(gpu: GpuProfile, model: ModelProfile, prompt_tokens: int) -> float:
    """One step prefilling a whole ``prompt_tokens`` prompt alone (no cache hit)."""
    return step_time(gpu, [(model, request_load(0, prompt_tokens))])


def decode_step_time(gpu: GpuProfile, model: ModelProfile, context_tokens: int) -> float:
    """One decode step of a single request whose KV already holds ``context_tokens``."""
    return step_time(gpu, [(model, request_load(context_tokens, 1))])


def ttft_batch1(gpu: GpuProfile, model: ModelProfile, prompt_tokens: int) -> float:
    """Time to first token of a lone request whose prompt fits one step's token budget."""
    return request_overhead_s(gpu, model) + prefill_step_time(gpu, model, prompt_tokens)


def prefill_ms_per_token(gpu: GpuProfile, model: ModelProfile, prompt_tokens: int) -> float:
    """TTFT per prompt token at batch 1, in milliseconds (how public tables quote it)."""
    return 1000.0 * ttft_batch1(gpu, model, prompt_tokens) / prompt_tokens
