"""``lbtune cluster calibrate``: measure each replica's engine rates with a few requests.

The ``llm`` scheduler's ``mode predict`` predicts a request's TTFT and TPOT on every
replica from four rates (:class:`~lbtune.records.calibration.ReplicaRates`). For the GPUs
and models lbtune has profiles of they come from the cost model; for a replica lbtune
did not build (a real vLLM, an unknown GPU) they come from here: a short, bounded
measurement straight at the replica, one replica at a time, with the cluster otherwise
idle (the numbers are a lone replica's; traffic beside them would be measured too).

Per replica, every request a completion on fresh text (no prefix shared with another
probe, so nothing is served from the prefix cache), each measured point the least of
``repeats`` requests (a busy host only ever adds time):

1. one warm-up request (not measured: first requests pay for lazy initialisation);
2. the **decode step**: lone streamed requests of ``decode_tokens`` output tokens
   (``ignore_eos``), the time between their first and last token over the tokens between;
3. the **per-request slope**: ``batch`` such requests at once, the same step at that
   batch: ``(step_batch − step) / (batch − 1)``;
4. the **prefill rate and overhead**: one-token requests of a short, a middle and a long
   prompt (the long one doubled, up to a third of the context, until its TTFT is
   ``long_over_short`` times the short one's), their TTFTs fitted to the scheduler's own
   model of a lone request, ``overhead + sqrt(step² + (prompt_tokens / rate)²)`` (least
   squares over the rate, the overhead their mean residual). A one-token answer's time is its TTFT.

Replicas are measured one after another, ``settle_s`` apart: a CPU vLLM's engine keeps
polling for about a second after its last request, and on shared cores (the ``vllm-cpu``
preset) the next replica would measure twice as slow.

What the client sees is what is measured (the replica's own histograms are not needed:
a replica that exports none is calibrated the same way); loopback adds well under a
millisecond. Every request is bounded by ``timeout_s``; any failure is a
:class:`~lbtune.errors.ClusterError` naming the replica, and nothing is written.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from lbtune.cluster.probing import DEFAULT_PLAN, Probe, ProbePlan, Prober, context_length
from lbtune.errors import ClusterError, ConfigError
from lbtune.process import affinity
from lbtune.records.calibration import Calibration, ReplicaRates, read_calibration
from lbtune.records.endpoints import Endpoints, ReplicaEndpoint
from lbtune.records.quantiles import percentile
from lbtune.safety.secrets import api_key_from_env
from lbtune.targets.haproxy.target import HaproxyTarget

__all__ = ["calibrate", "fit_prefill", "hand_to_scheduler", "measure_replica"]

Progress = Callable[[str], None]


def fit_prefill(probes_: Sequence[tuple[int, float]], step_s: float) -> tuple[float, float, float]:
    """``(prefill tokens/s, overhead s, largest relative error)`` of lone requests'
    ``(prompt tokens, TTFT)`` fitted to ``overhead + sqrt(step² + (tokens / rate)²)``.

    Least squares over the rate (a golden-section search on its logarithm, 1 to 10⁸
    tokens/s); for each rate the overhead is the mean residual, kept ≥ 0. Needs two
    prompt lengths: one length alone cannot tell a rate from an overhead."""
    if len({p for p, _ in probes_}) < 2:
        raise ValueError("fit_prefill needs probes of two prompt lengths")

    def overhead(rate: float) -> float:
        return max(0.0, statistics.fmean(t - _lone(p, rate, step_s) for p, t in probes_))

    def sse(log_rate: float) -> float:
        rate = math.exp(log_rate)
        o = overhead(rate)
        return sum((o + _lone(p, rate, step_s) - t) ** 2 for p, t in probes_)

    lo, hi = 0.0, math.log(1e8)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = sse(a), sse(b)
    for _ in range(80):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = sse(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = sse(b)
    rate = math.exp((lo + hi) / 2)
    o = overhead(rate)
    err = max(abs(o + _lone(p, rate, step_s) - t) / t for p, t in probes_)
    return rate, o, err


def _steps(got: Sequence[Probe]) -> list[float]:
    return [x.step_s for x in got if x.step_s is not None]


def _lone(tokens: int, rate: float, step_s: float) -> float:
    return math.sqrt(step_s**2 + (tokens / rate) ** 2)


def measure_replica(
    rep: ReplicaEndpoint,
    plan: ProbePlan = DEFAULT_PLAN,
    *,
    api_key: str | None = None,
    progress: Progress | None = None,
) -> ReplicaRates:
    """The rates of one replica (module docstring)."""
    if not rep.models:
        raise ClusterError(f"replica {rep.name} serves no model: nothing to calibrate")
    model = rep.models[0]
    ctx = context_length(rep, model)
    # lbtune's token counts run below a real tokenizer's (×1.5 on Llama's): a third of the
    # context leaves room; without a context length the long prompt does not grow
    cap = ctx // 3 if ctx else plan.long_tokens
    if plan.max_prompt_tokens is not None:
        cap = min(cap, plan.max_prompt_tokens)
    if min(plan.long_tokens, cap) < 4 * plan.short_tokens:
        raise ConfigError(
            f"replica {rep.name}: its context ({ctx} tokens) is too short to calibrate with "
            f"{plan.short_tokens}-token prompts"
        )
    p = Prober(rep, model, plan, api_key)
    say = progress or (lambda _m: None)
    say(f"{rep.name}: warm-up, decode step alone and at batch {plan.batch}")
    p.send(plan.short_tokens, 2)
    step, slope = _decode(p, plan)
    rate, overhead, err, longest = _prefill(p, plan, cap, step, say)
    return ReplicaRates(
        name=rep.name,
        model=model,
        url=rep.url,
        prefill_tokens_per_s=rate,
        step_s=step,
        step_per_seq_s=slope,
        overhead_s=overhead,
        probes=p.sent,
        fit_error=err,
        longest_prompt_tokens=longest,
    )


def _decode(p: Prober, plan: ProbePlan) -> tuple[float, float]:
    """The lone decode step and what each further running request adds to it. The least
    of the repeats: a busy host only ever adds time (shared CPUs, FIELD-NOTES)."""
    short, out = plan.short_tokens, plan.decode_tokens
    step = min(s for _ in range(plan.repeats) for s in _steps(p.send(short, out)))
    if plan.batch < 2:
        return step, 0.0
    at_batch = min(
        percentile(_steps(p.send(short, out, n=plan.batch)), 50) for _ in range(plan.repeats)
    )
    return step, max(0.0, (at_batch - step) / (plan.batch - 1))


def _prefill(
    p: Prober, plan: ProbePlan, cap: int, step: float, say: Progress
) -> tuple[float, float, float, int]:
    """The prefill rate, the overhead, the fit's error and the longest prompt (the
    replica's count) from one-token requests of a short, a middle and a long prompt (the
    least TTFT of each). The long prompt doubles (up to ``cap``) while its TTFT is under
    ``long_over_short`` times the short one's: a fast engine on a short prompt measures
    only the noise."""

    short = p.least(plan.short_tokens)
    n = min(plan.long_tokens, cap)
    long = p.least(n)
    while long.ttft_s < plan.long_over_short * short.ttft_s and 2 * n <= cap:
        n *= 2
        long = p.least(n)
    mid = p.least((plan.short_tokens + n) // 2)
    say(f"{p.rep.name}: prefill of {short.prompt_tokens}, {mid.prompt_tokens} and "
        f"{long.prompt_tokens} prompt tokens (the replica's count)")  # fmt: skip
    rate, overhead, err = fit_prefill(
        [(x.prompt_tokens, x.ttft_s) for x in (short, mid, long)], step
    )
    return rate, overhead, err, long.prompt_tokens


def calibrate(
    ep: Endpoints,
    names: Sequence[str] = (),
    plan: ProbePlan = DEFAULT_PLAN,
    *,
    progress: Progress | None = None,
) -> Calibration:
    """Measure the named replicas (default: all) one at a time and write the state dir's
    ``calibration.json``, keeping earlier rates of replicas not measured now."""
    known = {r.name: r for r in ep.replicas}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(
            f"--replica {unknown[0]}: no such replica (the cluster has {', '.join(known)})"
        )
    chosen = [known[n] for n in names] if names else list(ep.replicas)
    key = api_key_from_env()
    measured: dict[str, ReplicaRates] = {}
    with affinity.kept_off(ep.reserved_cpus):  # the probes are sent from this process
        for i, r in enumerate(chosen):
            if i:
                time.sleep(plan.settle_s)
            measured[r.name] = measure_replica(r, plan, api_key=key, progress=progress)
    before = read_calibration(ep.state_dir)
    kept = [r for r in (before.replicas if before else []) if r.name not in measured]
    if before is not None and before.time_scale != ep.time_scale:
        kept = []  # measured at another time scale: not comparable
    out = Calibration(
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        time_scale=ep.time_scale,
        replicas=sorted([*kept, *measured.values()], key=lambda r: r.name),
    )
    out.write(ep.state_dir)
    return out


def hand_to_scheduler(ep: Endpoints) -> bool:
    """Give the written rates to the running balancer's ``llm`` scheduler (HAProxy's):
    ``True`` when it took them, ``False`` when it runs no such scheduler (the rates wait
    in ``calibration.json`` for an apply that switches it on)."""
    if ep.balancer != "haproxy":
        return False
    return HaproxyTarget(ep).take_rates()
