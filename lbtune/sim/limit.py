"""The no-queueing limit: each request's service time alone on the fastest replica.

For a request of ``prompt_tokens`` in and ``output_tokens`` out, served alone (no other
request in the batch, no prefix-cache hit), the simulator's cost model gives

    TTFT = request_overhead + sum over prefill chunks c of step(chunk c after earlier ones)
    E2E  = TTFT + sum over i = 1 .. output_tokens - 1 of decode_step(context P + i - 1)

where chunks hold at most ``chunk_tokens`` (the engine's ``max_num_batched_tokens``) and
every figure is divided by the cluster's time scale (what the simulated server sleeps).
The fastest replica is the one, among those serving the request's model, with the lowest
E2E. No balancer can do better on a request than this (short of a cache hit), so a
column's P99 over the limit's P99 says how much of its tail is queueing and placement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lbtune.sim.costmodel import decode_batch_load, request_load, request_overhead_s, step_time
from lbtune.sim.profiles import GpuProfile, ModelProfile, get_gpu, get_model

__all__ = ["Alone", "ReplicaSpec", "alone", "fastest"]

DEFAULT_CHUNK_TOKENS = 2048
"""The simulated engine's default ``max_num_batched_tokens``."""


@dataclass(frozen=True)
class ReplicaSpec:
    name: str
    gpu: str
    models: tuple[str, ...]


@dataclass(frozen=True)
class Alone:
    """One request's service time alone, on ``replica`` (seconds of wall clock)."""

    ttft_s: float
    e2e_s: float
    replica: str


def alone(
    gpu: GpuProfile,
    model: ModelProfile,
    prompt_tokens: int,
    output_tokens: int,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[float, float]:
    """``(ttft, e2e)`` in model seconds (time scale 1) of a lone request; see the module."""
    if prompt_tokens < 1 or chunk_tokens < 1:
        raise ValueError("prompt_tokens and chunk_tokens must be at least 1")
    t = request_overhead_s(gpu, model)
    done = 0
    while done < prompt_tokens:
        q = min(chunk_tokens, prompt_tokens - done)
        t += step_time(gpu, [(model, request_load(done, q))])
        done += q
    ttft = t
    for i in range(1, max(1, output_tokens)):
        t += step_time(gpu, [(model, decode_batch_load(1, prompt_tokens + i - 1))])
    return ttft, t


def fastest(
    replicas: Sequence[ReplicaSpec],
    model: str,
    prompt_tokens: int,
    output_tokens: int,
    *,
    time_scale: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> Alone | None:
    """The lowest-E2E lone service among ``replicas`` serving ``model``; ``None`` if none
    serves it. Unknown GPU or model profiles raise :class:`~lbtune.errors.ConfigError`."""
    best: Alone | None = None
    for r in replicas:
        if model not in r.models:
            continue
        ttft, e2e = alone(
            get_gpu(r.gpu), get_model(model), prompt_tokens, output_tokens, chunk_tokens
        )
        if best is None or e2e / time_scale < best.e2e_s:
            best = Alone(ttft / time_scale, e2e / time_scale, r.name)
    return best
