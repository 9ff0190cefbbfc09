"""The replicas kept busy: the step and the front end a fit measures under load.

Lone and synchronized-batch probes miss what a busy host costs: on the vLLM CPU preset a
step of 8 took 8.8 ms kept busy against 7.6 ms fitted, and a request's TTFT 44 ms against
~21 ms (its API server waits for CPU behind the engines). So ``lbtune twin fit --steady``
keeps each replica at ``streams`` closed-loop streams for a while
(:func:`~lbtune.cluster.steady.steady_state`; all at once where they share CPUs) and
puts what it measured into the replica's fit (:func:`with_busy`): the per-request slope,
the **busy overhead** the twin charges a request that arrives while others run, and the
time its ``/metrics`` takes to answer (the ``llm`` scheduler's scrape).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import gevent

from lbtune.cluster.probing import DEFAULT_PLAN, ProbePlan
from lbtune.cluster.steady import Steady, steady_state
from lbtune.records.endpoints import Endpoints, ReplicaEndpoint
from lbtune.twin.fitted import Measured, ReplicaFit

__all__ = ["STEADY_PROMPT_TOKENS", "STEADY_S", "BusyPlan", "keep_busy", "with_busy"]

Say = Callable[[str], None]
STEADY_PROMPT_TOKENS = 256
"""Prompts of the steady-state probe: a chat prompt's size."""
STEADY_S = 20.0
"""Seconds of the steady-state probe, the first :data:`STEADY_WARMUP_S` not measured."""
STEADY_WARMUP_S = 3.0


@dataclass(frozen=True)
class BusyPlan:
    """How the replicas are kept busy."""

    streams: int
    """Closed-loop streams per replica (at most its ``max_num_seqs``, at least 2)."""
    duration_s: float = STEADY_S
    probes: ProbePlan = DEFAULT_PLAN
    together: bool = False
    """All replicas at once (they share CPUs), else one after another."""


def keep_busy(
    ep: Endpoints, fits: list[ReplicaFit], plan: BusyPlan, key: str | None, say: Say
) -> list[ReplicaFit]:
    """The replicas kept busy (closed loop, ``batch`` streams each; all at once where they
    share CPUs): what a step and the front end cost while the engines run, as under load.
    Lone and synchronized-batch probes missed it on the vLLM CPU preset: a step of 8 took
    8.8 ms kept busy against 7.6 fitted, and a request's TTFT 44 ms against ~21 (its API
    server waits for CPU behind the engines)."""
    streams = {f.name: max(2, min(plan.streams, f.max_num_seqs)) for f in fits}
    warmup = min(STEADY_WARMUP_S, plan.duration_s / 4)

    def one(rep: ReplicaEndpoint) -> Steady:
        say(
            f"{rep.name}: kept busy, {streams[rep.name]} streams of "
            f"{STEADY_PROMPT_TOKENS}-token prompts for {plan.duration_s:g} s"
        )
        return steady_state(
            rep,
            streams[rep.name],
            STEADY_PROMPT_TOKENS,
            plan.probes,
            duration_s=plan.duration_s,
            warmup_s=warmup,
            api_key=key,
        )

    if not plan.together:
        return [with_busy(f, one(rep)) for f, rep in zip(fits, ep.replicas, strict=True)]
    jobs = [gevent.spawn(one, rep) for rep in ep.replicas]
    try:
        gevent.joinall(jobs, raise_error=True)
    finally:
        gevent.killall([j for j in jobs if not j.ready()])
    return [with_busy(f, j.value) for f, j in zip(fits, jobs, strict=True)]


def with_busy(fit: ReplicaFit, s: Steady) -> ReplicaFit:
    """``fit`` with the slope and the busy overhead of its steady state: the slope puts a
    step of ``s.streams`` at the measured one, less the KV reads the twin adds on its own
    (the streams' mean context: prompt and half the output each) and less the other
    streams' prefills, which the twin's engine runs in their own steps: while one request
    decodes its ``output_tokens``, each of the ``streams - 1`` others (drifting apart,
    :data:`~lbtune.cluster.steady.OUTPUT_SPREAD`) prefills once, ``prompt / rate`` each,
    spread over its tokens. The busy overhead is the TTFT left once the step under way and
    the request's own step are counted."""
    step = fit.step_s.value
    context = s.streams * (s.prompt_tokens + s.output_tokens / 2)
    kv = fit.kv_s_per_token.value * context
    prefill = s.prompt_tokens / fit.prefill_tokens_per_s.value
    others = (s.streams - 1) * prefill / max(1, s.output_tokens - 1)
    slope = max(0.0, (s.step_s - step - kv - others) / (s.streams - 1))
    own = math.hypot(s.step_s, prefill)
    busy = max(fit.overhead_s.value, s.ttft_s - s.step_s - own)
    return fit.model_copy(
        update={
            "step_per_seq_s": Measured(value=slope, rel_uncertainty=fit.step_s.rel_uncertainty),
            "busy_overhead_s": Measured(value=busy, rel_uncertainty=fit.overhead_s.rel_uncertainty),
            "scrape_s": None
            if s.scrape_s is None
            else Measured(value=s.scrape_s, rel_uncertainty=0),
            "probes": fit.probes + s.sent,
            "engine_view": s.engine,
        }
    )
