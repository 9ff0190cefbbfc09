"""Replicas the twin simulates from measurements: a fitted profile (``lbtune twin fit``).

A replica lbtune did not build (a real vLLM, a GPU it has no profile of) has no GPU
profile for the cost model's roofline. What can be measured from outside is what
``lbtune cluster calibrate`` measures (:class:`~lbtune.records.calibration.ReplicaRates`):
a lone decode step, what each further running request adds to it, the prefill rate and
the front-end overhead; and from vLLM's ``/metrics`` the KV cache's size. The twin runs
the sim's engine (batching, chunked prefill, KV blocks, prefix cache, preemption) over
those: a step of ``rows`` requests that prefills ``P`` prompt tokens takes::

    weights   = step_s + step_per_seq_s × (rows − 1)
    attention = kv_s_per_token × K + attn_s_per_pair × E
    step      = sqrt(weights² + (P / prefill_tokens_per_s)²) + attention

(``K``: the tokens of context its decodes read; ``E``: the (query, key) pairs of its
prefill chunks against earlier tokens, and among a chunk's own beyond those of the longest
prompt the rate was fitted on: quadratic in a long prompt). It is the
calibration's own model (a lone request's TTFT is ``overhead + sqrt(step² + (prompt /
rate)²)``, a batch of ``n`` decodes a token every ``step + slope × (n − 1)``) with
attention beside it, as the roofline has it (its own kernels, not hidden by the GEMMs),
so the rates mean in the twin what they meant when they were fitted.

:class:`TwinProfile` is the file (``twin-profile.json``): each replica's values with their
uncertainty, and the held-back validation that says how far to trust it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lbtune.errors import ConfigError
from lbtune.records.statedir import write_json_atomic
from lbtune.safety.files import MAX_DOCUMENT_BYTES, read_text
from lbtune.sim.batch import BatchLoad
from lbtune.sim.costmodel import StepCost
from lbtune.sim.engine import EngineConfig, StepCostFn
from lbtune.sim.profiles import GIB, GpuProfile, ModelProfile

__all__ = [
    "FIT_METRICS",
    "MAX_ERROR",
    "Drift",
    "EngineView",
    "Measured",
    "ReplicaFit",
    "TwinProfile",
    "Validation",
    "drift",
    "engine_parts",
    "expand_tokens",
    "lone_ttft",
    "read_profile",
    "solve_attention",
    "step_cost",
    "trusted_profile",
]

PROFILE_VERSION = 1
MAX_ERROR = 0.25
"""A profile whose validation misses a figure by more than this (|twin / live − 1|) is not
trusted for screening: ``optimize`` and ``capacity`` refuse it (the threshold is also
``--max-error``)."""
FIT_METRICS = ("p99_e2e_s", "p99_ttft_s", "requests_per_s")
MAX_TOKEN_RATIO = 4.0
"""The most replica tokens per lbtune token a fit takes (:func:`expand_tokens`)."""
UNBOUNDED_KV_TOKENS = 1 << 30
"""A replica whose KV size is not exported: taken as never full (said in the profile)."""


class Measured(BaseModel):
    """A fitted value and how sure of it the fit is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    value: float = Field(ge=0)
    rel_uncertainty: float = Field(ge=0)
    """Relative: half the spread of the repeated measurements (or the fit's own error)."""


class EngineView(BaseModel):
    """What a replica's own histograms said while the fit kept it busy (vLLM's
    ``time_to_first_token``, ``request_queue_time``, ``request_prefill_time``,
    ``request_decode_time``, ``inter_token_latency`` and ``iteration_tokens_total``: the
    means of their sums and counts over the measured part, as a Prometheus scrape of it
    would read them), beside what the client measured meanwhile. Reported, not fitted: the
    twin's rates come from the client's view, which is what a balancer's users see."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: int = Field(ge=1)
    """Requests the replica counted in its TTFT histogram meanwhile."""
    ttft_s: float = Field(ge=0)
    """Mean TTFT by the replica's clock (arrival at its engine to first token)."""
    queue_s: float | None = Field(default=None, ge=0)
    """Mean time waiting to be scheduled (None: not exported)."""
    prefill_s: float | None = Field(default=None, ge=0)
    """Mean time from first scheduled to first token."""
    decode_s: float | None = Field(default=None, ge=0)
    """Mean time from first token to the last."""
    itl_s: float | None = Field(default=None, ge=0)
    """Mean time between output tokens."""
    iteration_tokens: float | None = Field(default=None, ge=0)
    """Mean tokens per engine step (prefill and decode together)."""
    client_ttft_s: float = Field(ge=0)
    """The client's mean TTFT over the same part: what it has beyond :attr:`ttft_s` is the
    front end's (HTTP, tokenising, the API server waiting for CPU)."""


class ReplicaFit(BaseModel):
    """One replica as the twin simulates it. Times are wall seconds as measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    model: str
    url: str
    prefill_tokens_per_s: Measured
    step_s: Measured
    step_per_seq_s: Measured
    overhead_s: Measured
    busy_overhead_s: Measured | None = None
    """The front end's time per request while the replica runs others, where it was
    measured (replicas on shared CPUs: their API servers wait for CPU behind the busy
    engines, 3-5x the idle overhead on the vLLM CPU preset); None: ``overhead_s``."""
    scrape_s: Measured | None = None
    """How long its ``/metrics`` took to answer while it was kept busy (``--steady``):
    what a scheduler scraping it waits (the ``llm`` scheduler's scrape round in the twin);
    None: not measured."""
    kv_s_per_token: Measured = Measured(value=0.0, rel_uncertainty=0.0)
    """What each token of context a decode reads adds to a step (long contexts' KV reads)."""
    attn_s_per_pair: Measured = Measured(value=0.0, rel_uncertainty=0.0)
    """What each (query, key) pair of a prefill chunk adds beyond the linear rate: a long
    prompt's attention grows with its square (a GPU's as its later chunks attend back to
    the earlier ones, a CPU's also within one chunk)."""
    linear_tokens: int = Field(default=0, ge=0)
    """Prompts up to this many tokens were in the prefill rate's own fit: a chunk's pairs
    among its own tokens count only beyond those of a chunk this long (the rate has them)."""
    chunk_tokens: int = Field(default=2048, ge=1)
    """Prompt tokens a step prefills at most (the engine's token budget, as fitted)."""
    kv_tokens: int | None = Field(default=None, ge=1)
    """KV cache size in tokens (vLLM's ``cache_config_info``: blocks × block size); None
    where the replica does not export it (the twin then never fills it)."""
    block_size: int = Field(default=16, ge=1)
    max_num_seqs: int = Field(default=256, ge=1)
    """Requests a step may run at once (from the cluster file where it says, else vLLM's
    default)."""
    max_model_len: int | None = Field(default=None, ge=1)
    probes: int = Field(default=1, ge=1)
    """Requests the fit sent to this replica."""
    prompt_token_ratio: float = Field(default=1.0, gt=0, le=MAX_TOKEN_RATIO)
    """The replica's count of a prompt per lbtune token (its tokenizer on lbtune's text: 1
    on lbtune's simulator, ~1.5 on a real Llama's): the rates are per the replica's tokens,
    and its KV holds them, so the twin counts a prompt as the replica would."""
    engine_view: EngineView | None = None
    """The replica's histograms while kept busy (``--steady``); None: not measured, or it
    exports none."""


class Validation(BaseModel):
    """The fitted twin against a live run it did not see."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scenario: str
    duration_s: float
    runs: int = Field(ge=1)
    """Live runs (each its own seed), each simulated on its own recorded plan."""
    live: dict[str, float | None]
    """Each figure of :data:`FIT_METRICS`, the mean over the live runs."""
    twin: dict[str, float | None]
    """The same from the fitted twin on the runs' plans."""
    errors: dict[str, float]
    """|twin / live − 1| per figure both sides have."""
    live_spread: dict[str, float] = Field(default_factory=dict)
    """|one live run / another − 1| (largest pair): how far live runs alone differ, the
    noise an error is to be read against."""

    @property
    def worst(self) -> tuple[str, float]:
        """The figure the twin missed most and by how much."""
        if not self.errors:
            return "none", math.inf
        name = max(self.errors, key=lambda k: self.errors[k])
        return name, self.errors[name]


class TwinProfile(BaseModel):
    """What ``twin-profile.json`` holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = PROFILE_VERSION
    measured_at: str
    """ISO 8601, UTC."""
    cluster: str
    time_scale: float = Field(gt=0)
    replicas: list[ReplicaFit]
    validation: Validation | None = None

    def by_name(self) -> dict[str, ReplicaFit]:
        return {r.name: r for r in self.replicas}

    def trusted(self, max_error: float = MAX_ERROR) -> str | None:
        """None when the validation holds within ``max_error``; else why not (one line)."""
        if self.validation is None:
            return "it has no validation (run `lbtune twin fit` without --no-validate)"
        name, err = self.validation.worst
        if err > max_error:
            spread = self.validation.live_spread.get(name)
            noise = "" if spread is None else f", live runs alone differed by {spread:.0%}"
            return (
                f"its validation missed {name} by {err:.0%} (more than {max_error:.0%}{noise}); "
                "refit with a longer validation (--duration) or on a quieter machine"
            )
        return None

    def write(self, path: str | Path) -> Path:
        p = Path(path)
        write_json_atomic(p, self.model_dump_json(indent=2) + "\n")
        return p


def read_profile(path: str | Path, flag: str = "--twin-profile") -> TwinProfile:
    """The profile at ``path``; a :class:`ConfigError` naming the file otherwise."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{flag} {p}: no such file (lbtune twin fit writes one)")
    try:
        prof = TwinProfile.model_validate_json(read_text(p, max_bytes=MAX_DOCUMENT_BYTES))
    except (ValidationError, ValueError) as exc:
        raise ConfigError(
            f"{flag} {p}: not a twin profile ({exc.__class__.__name__}); "
            "run `lbtune twin fit` again"
        ) from None
    if prof.version != PROFILE_VERSION:
        raise ConfigError(f"{flag} {p}: version {prof.version}, expected {PROFILE_VERSION}")
    return prof


def trusted_profile(path: str | Path, max_error: float, without: str) -> TwinProfile:
    """The profile at ``path`` when its validation holds within ``max_error``; else a
    :class:`ConfigError` (one line) that says which figure missed by how much and
    ``without`` (how to go on without the twin, e.g. ``--screen 0``)."""
    prof = read_profile(path)
    why = prof.trusted(max_error)
    if why is not None:
        raise ConfigError(f"--twin-profile {path}: not trusted: {why}; or {without}")
    return prof


def step_cost(fit: ReplicaFit, time_scale: float) -> StepCostFn:
    """The step time of ``fit``'s replica in model seconds (wall × ``time_scale``, as the
    twin's replicas count them) — the module's formula."""
    step = fit.step_s.value * time_scale
    slope = fit.step_per_seq_s.value * time_scale
    per_kv = fit.kv_s_per_token.value * time_scale
    per_token = time_scale / fit.prefill_tokens_per_s.value
    per_pair = fit.attn_s_per_pair.value * time_scale
    in_rate = fit.linear_tokens * (fit.linear_tokens + 1) / 2

    def cost(load: BatchLoad) -> StepCost:
        rows = sum(load.rows)
        if rows == 0:
            return StepCost(0.0, 0.0)
        chunks = sum(load.rows) - load.decode_tokens
        causal = sum(load.causal_pairs)
        earlier = sum(load.pairs) - sum(load.decode_pairs) - causal
        pairs = earlier + max(0.0, causal - chunks * in_rate)
        prefill = load.prefill_tokens * per_token
        # attention reads KV and attends back in kernels of its own: not hidden by the GEMMs
        attention = per_kv * max(0, sum(load.kv_read) - load.prefill_tokens)
        attention += per_pair * max(0.0, pairs)
        body = math.hypot(step + slope * (rows - 1), prefill)
        return StepCost(body + attention, prefill + per_pair * max(0.0, pairs))

    return cost


def expand_tokens(ids: list[int], ratio: float) -> list[int]:
    """``ids`` as a replica that counts ``ratio`` tokens per lbtune token would hold them:
    token ``p`` becomes ``floor((p + 1)·ratio) − floor(p·ratio)`` ids of its own, so two
    prompts sharing ``n`` tokens share the first ``floor(n·ratio)`` (the prefix cache still
    sees their shared prefix)."""
    if ratio == 1.0:
        return ids
    k = math.ceil(MAX_TOKEN_RATIO)
    out: list[int] = []
    for p, t in enumerate(ids):
        n = math.floor((p + 1) * ratio) - math.floor(p * ratio)
        out.extend(t * k + j for j in range(n))
    return out


def lone_ttft(fit: ReplicaFit, prompt_tokens: int, attn_s_per_pair: float | None = None) -> float:
    """A lone request's TTFT (wall seconds) in the fitted model: its chunks of
    ``chunk_tokens`` one step each, each attending to itself and the earlier tokens."""
    a = fit.attn_s_per_pair.value if attn_s_per_pair is None else attn_s_per_pair
    in_rate = fit.linear_tokens * (fit.linear_tokens + 1) / 2
    t, done = fit.overhead_s.value, 0
    while done < prompt_tokens:
        n = min(fit.chunk_tokens, prompt_tokens - done)
        pairs = n * done + max(0.0, n * (n + 1) / 2 - in_rate)
        t += math.hypot(fit.step_s.value, n / fit.prefill_tokens_per_s.value) + a * pairs
        done += n
    return t


def solve_attention(fit: ReplicaFit, prompt_tokens: int, ttft_s: float) -> float:
    """The ``attn_s_per_pair`` with which :func:`lone_ttft` of ``prompt_tokens`` is
    ``ttft_s`` (bisection; 0 where it came in as fast as the linear model or faster)."""
    if ttft_s <= lone_ttft(fit, prompt_tokens, 0.0):
        return 0.0
    lo, hi = 0.0, 1e-9
    while lone_ttft(fit, prompt_tokens, hi) < ttft_s and hi < 1.0:
        hi *= 4
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if lone_ttft(fit, prompt_tokens, mid) < ttft_s else (lo, mid)
    return (lo + hi) / 2


def engine_parts(
    fit: ReplicaFit, time_scale: float
) -> tuple[GpuProfile, ModelProfile, EngineConfig]:
    """A GPU and a model profile that give the engine ``fit``'s KV cache (one byte a
    token, no weights) and its limits; their arithmetic is never used (:func:`step_cost`
    costs the steps), only the request overhead (model seconds)."""
    kv = fit.kv_tokens or UNBOUNDED_KV_TOKENS
    cfg = EngineConfig(
        max_num_seqs=fit.max_num_seqs,
        max_num_batched_tokens=fit.chunk_tokens,
        block_size=fit.block_size,
        max_model_len=fit.max_model_len,
    )
    gpu = GpuProfile(
        name=f"fitted:{fit.name}",
        memory_gib=(kv + fit.block_size) / cfg.gpu_memory_utilization / GIB,
        mem_bandwidth=1.0,
        peak_bf16_tflops=1.0,
        bw_efficiency=1.0,
        flop_efficiency=1.0,
        attn_efficiency=1.0,
        attn_causal_efficiency=1.0,
        attn_bw_efficiency=1.0,
        elementwise_efficiency=1.0,
        elementwise_floor_s=0.0,
        attn_floor_s=0.0,
        attn_seq_tokens=0.0,
        step_overhead_s=0.0,
        request_overhead_s=fit.overhead_s.value * time_scale,
        description="fitted from measurements (lbtune twin fit)",
    )
    model = ModelProfile(
        name=fit.model,
        params=1.0,
        weight_bytes=0,
        kv_bytes_per_token=1,
        context_length=fit.max_model_len or 1 << 20,
        n_layers=1,
        hidden_size=1,
        intermediate_size=1,
        vocab_size=1,
    )
    return gpu, model, cfg


@dataclass(frozen=True)
class Drift:
    """How one replica's rates moved between two fits (positive: slower now)."""

    replica: str
    decode: float
    """Decode step, new / old − 1."""
    prefill: float
    """Time per prompt token (1 / rate), new / old − 1."""
    overhead: float
    """Front-end overhead, new / old − 1."""
    beyond_noise: bool
    """Decode or prefill moved by more than the two fits' uncertainties together."""

    @property
    def slower(self) -> float:
        """The larger of the decode and prefill slow-downs (negative: faster)."""
        return max(self.decode, self.prefill)


def drift(old: TwinProfile, new: TwinProfile) -> list[Drift]:
    """Each replica in both profiles, how much slower (or faster) it is now. Times are wall
    seconds: fits at different time scales are not compared (a :class:`ConfigError`)."""
    if old.time_scale != new.time_scale:
        raise ConfigError(
            f"--baseline: fitted at time scale {old.time_scale:g}, this cluster runs at "
            f"{new.time_scale:g} (wall times would differ by that alone); compare fits of "
            "one time scale"
        )
    before = old.by_name()
    out: list[Drift] = []
    for f in new.replicas:
        o = before.get(f.name)
        if o is None or o.model != f.model:
            continue
        decode = f.step_s.value / o.step_s.value - 1
        prefill = o.prefill_tokens_per_s.value / f.prefill_tokens_per_s.value - 1
        overhead = f.overhead_s.value / o.overhead_s.value - 1 if o.overhead_s.value > 0 else 0.0
        noise_d = f.step_s.rel_uncertainty + o.step_s.rel_uncertainty
        noise_p = f.prefill_tokens_per_s.rel_uncertainty + o.prefill_tokens_per_s.rel_uncertainty
        beyond = abs(decode) > noise_d or abs(prefill) > noise_p
        out.append(Drift(f.name, decode, prefill, overhead, beyond))
    return out
