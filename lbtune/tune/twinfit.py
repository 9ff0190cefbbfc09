"""``lbtune twin fit``: fit each replica of the running cluster from measurements, then
check the fitted twin against a live run it did not see.

Per replica, straight at its URL, one replica at a time (the rest idle), every request
bounded by the probe plan's timeout; all at once where the vLLM preset pins its servers to
shared CPUs (under load all of them are busy: measured alone, each looked 2-3x faster than
it serves; charging a step for the group's other busy replicas instead fitted worse,
docs/twin.md):

1. ``lbtune cluster calibrate``'s measurement twice (:func:`~lbtune.cluster.calibrate.
   measure_replica`): the lone decode step, the per-request slope, the prefill rate and the
   front-end overhead; the value is the mean of the two passes, its uncertainty half their
   spread (or the prefill fit's own error where larger);
2. the decode step of ``batch`` requests at once with a short prompt (the slope measured at
   a batch the twin will see, not only at four) and with a long one (what each token of
   context a decode reads adds: ``kv_s_per_token``);
3. the KV cache's size from the replica's ``/metrics`` (vLLM's ``cache_config_info``) and
   its tokenizer's count of lbtune's prompt text (``prompt_token_ratio``);
4. with ``--steady`` (the default where the replicas share CPUs), every replica kept busy
   (:mod:`lbtune.tune.twinbusy`): the slope, the busy overhead and the scrape time under load.

The fit also becomes the state dir's ``calibration.json`` (the ``llm`` scheduler's rates,
the same numbers). Then, unless told not to, **validation** (:mod:`lbtune.tune.
twinvalidate`): live runs of a scenario through the balancer at its current config against
the fitted twin on each run's recorded plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import gevent

from lbtune.cluster import api
from lbtune.cluster.calibrate import hand_to_scheduler, measure_replica
from lbtune.cluster.config import parse_config
from lbtune.cluster.probing import (
    ProbePlan,
    context_length,
    decode_step_at,
    kv_cache_size,
    least_ttft,
)
from lbtune.cluster.vllm import ServerSettings
from lbtune.errors import ConfigError
from lbtune.process import affinity
from lbtune.records.calibration import Calibration, ReplicaRates
from lbtune.records.endpoints import Endpoints, ReplicaEndpoint
from lbtune.records.statedir import StatePaths, read_config_json
from lbtune.safety.secrets import api_key_from_env
from lbtune.tune.twinbusy import STEADY_S, BusyPlan, keep_busy
from lbtune.tune.twinvalidate import ValidationPlan, check_scenario, validate_profile
from lbtune.twin.fitted import (
    MAX_TOKEN_RATIO,
    Measured,
    ReplicaFit,
    TwinProfile,
    solve_attention,
)

__all__ = ["FitOptions", "fit_twin", "load_statement"]

Say = Callable[[str], None]
VLLM_MAX_NUM_SEQS = 256
"""vLLM's default ``--max-num-seqs``: what an external replica is taken to run."""
LONG_SHARE = 0.45
"""The longest lone prompt: this share of the context in lbtune's tokens (a real tokenizer
counts ~1.5x more: two thirds of the context), at most four chunks."""
LONG_OVER = 1.3
"""... sent only when it is this much longer than the calibration's longest prompt."""
RATIO_TOKENS = 512
"""A prompt of this many lbtune tokens, counted by the replica: its tokenizer's ratio."""
CHUNK_TOKENS = 2048
"""The token budget of a step the fit assumes (the simulator's and vLLM's smallest default)."""
FIT_PLAN = ProbePlan(max_prompt_tokens=CHUNK_TOKENS, decode_tokens=32)
"""Prompts within one step's token budget (2048: the simulator's and vLLM's smallest
default), where the lone-request model is the engine's own; longer decodes (32) so the
batch probes' second half is all decode."""


@dataclass(frozen=True)
class FitOptions:
    state_dir: Path | None = None
    out: Path | None = None
    """Where the profile goes (default: ``twin-profile.json`` in the state dir)."""
    validate: bool = True
    scenario: str = "chat"
    duration_s: float = 30.0
    seed: int | None = None
    batch: int = 8
    """Requests at once for the batch decode probes (capped at the replica's max_num_seqs)."""
    runs: int = 2
    """Live validation runs (each its own seed)."""
    long_tokens: int = 1024
    """Prompt tokens of the long batch probe (capped at a third of the context)."""
    plan: ProbePlan = FIT_PLAN
    steady: bool | None = None
    """Keep the replicas busy (closed loop) to measure a step and the front end under
    load; None: where the replicas share CPUs (all at once there)."""
    steady_s: float = STEADY_S

    @property
    def validation(self) -> ValidationPlan:
        return ValidationPlan(self.scenario, self.duration_s, self.runs, self.seed)


def profile_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / "twin-profile.json"


def load_statement(
    ep: Endpoints, opts: FitOptions, together: bool = False, steady: bool = False
) -> str:
    """What the fit will send, said before it sends anything."""
    p = opts.plan
    per = 2 * (25 + 3) + 2 * p.repeats * opts.batch
    out = (
        f"twin fit: {len(ep.replicas)} replicas, "
        f"{'all at once (they share CPUs)' if together else 'one at a time'}, "
        "straight at each: about "
        f"{per} requests each (at most {max(p.batch, opts.batch)} at once, prompts up to a "
        f"third of the context, {p.timeout_s:g} s timeout each)"
    )
    if steady:
        out += (
            f", then {'all at once' if together else 'each'} kept busy for "
            f"{opts.steady_s:g} s ({opts.batch} streams each, closed loop)"
        )
    if opts.validate:
        out += (
            f"; then {opts.runs} runs of scenario {opts.scenario}, {opts.duration_s:g} s each, "
            "through the balancer at its current config (validation)"
        )
    return out


def fit_twin(opts: FitOptions, say: Say) -> tuple[TwinProfile, Path]:
    """See the module docstring; the profile and where it was written. ConfigError when no
    cluster runs; ClusterError (naming the replica) when a probe fails: nothing is written."""
    if opts.batch < 2:
        raise ConfigError(f"--batch: at least 2, got {opts.batch}")
    if not 5 <= opts.duration_s <= 300:
        raise ConfigError(f"--duration: 5 to 300 s, got {opts.duration_s:g}")
    if not 1 <= opts.runs <= 5:
        raise ConfigError(f"--runs: 1 to 5, got {opts.runs}")
    if not 2 <= opts.steady_s <= 120:
        raise ConfigError(f"steady-state probe: 2 to 120 s, got {opts.steady_s:g}")
    st = api.status(opts.state_dir)
    if not st.running or st.endpoints is None:
        raise ConfigError("twin fit: no cluster running (lbtune cluster up)")
    ep = st.endpoints
    if opts.validate:
        check_scenario(opts.scenario, ep)
    facts = _replica_facts(ep.state_dir)
    say(load_statement(ep, opts, facts.shared_cpus, _steady(opts, facts)))
    with affinity.kept_off(ep.reserved_cpus):  # the probes are sent from this process
        fits = _fit_all(ep, opts, facts, api_key_from_env(), say)
    profile = TwinProfile(
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        cluster=ep.config_name,
        time_scale=ep.time_scale,
        replicas=fits,
    )
    _calibration(profile).write(ep.state_dir)
    hand_to_scheduler(ep)
    if opts.validate:
        profile = profile.model_copy(
            update={"validation": validate_profile(profile, opts.validation, ep.state_dir, say)}
        )
    out = profile.write(opts.out or profile_path(ep.state_dir))
    return profile, out


def _steady(opts: FitOptions, facts: _Facts) -> bool:
    """Keep the replicas busy: as asked, else where they share CPUs."""
    return facts.shared_cpus if opts.steady is None else opts.steady


def _fit_all(
    ep: Endpoints, opts: FitOptions, facts: _Facts, key: str | None, say: Say
) -> list[ReplicaFit]:
    """Every replica's fit: one at a time, or all at once where they share CPUs."""
    together = facts.shared_cpus
    fits: list[ReplicaFit] = []
    if together:  # under load they are all busy: measured alone, each would look 2x faster
        jobs = [gevent.spawn(_fit_replica, r, opts, facts, key, say) for r in ep.replicas]
        try:
            gevent.joinall(jobs, raise_error=True)  # a replica that fails: one line, naming it
        finally:
            gevent.killall([j for j in jobs if not j.ready()])  # and no probe goes on
        fits = [j.value for j in jobs]
    else:
        for i, rep in enumerate(ep.replicas):
            if i:
                time.sleep(opts.plan.settle_s)
            fits.append(_fit_replica(rep, opts, facts, key, say))
    if _steady(opts, facts):
        fits = keep_busy(
            ep, fits, BusyPlan(opts.batch, opts.steady_s, opts.plan, together), key, say
        )
    return fits


def _fit_replica(
    rep: ReplicaEndpoint, opts: FitOptions, facts: _Facts, key: str | None, say: Say
) -> ReplicaFit:
    chunk, seqs = facts.chunk_tokens, facts.max_num_seqs
    plan = replace(opts.plan, max_prompt_tokens=min(opts.plan.max_prompt_tokens or chunk, chunk))
    a = measure_replica(rep, plan, api_key=key, progress=say)
    b = measure_replica(rep, plan, api_key=key)
    batch = max(2, min(opts.batch, seqs))
    kv = kv_cache_size(rep)
    counted, _ = least_ttft(rep, RATIO_TOKENS, plan, api_key=key)
    ratio = min(MAX_TOKEN_RATIO, max(counted, 1) / RATIO_TOKENS)
    ctx = context_length(rep, a.model)
    third = ctx // 3 if ctx else opts.long_tokens
    long = max(plan.short_tokens * 4, min(opts.long_tokens, third))
    say(f"{rep.name}: decode at batch {batch}, prompts of {plan.short_tokens} and {long} tokens")
    short_b = decode_step_at(rep, batch, plan.short_tokens, plan, api_key=key)
    long_b = decode_step_at(rep, batch, long, plan, api_key=key)
    step = _measured(a.step_s, b.step_s)
    slope = max(0.0, (short_b - step.value) / (batch - 1))
    kv_s = max(0.0, (long_b - short_b) / (batch * (long - plan.short_tokens)))
    prefill_err = max(a.fit_error, b.fit_error)
    fit = ReplicaFit(
        name=rep.name,
        model=a.model,
        url=rep.url,
        prefill_tokens_per_s=_measured(a.prefill_tokens_per_s, b.prefill_tokens_per_s, prefill_err),
        step_s=step,
        step_per_seq_s=Measured(value=slope, rel_uncertainty=step.rel_uncertainty),
        kv_s_per_token=Measured(value=kv_s, rel_uncertainty=step.rel_uncertainty),
        overhead_s=_measured(a.overhead_s, b.overhead_s),
        chunk_tokens=chunk,
        kv_tokens=kv[0] * kv[1] if kv else None,
        block_size=kv[0] if kv else 16,
        max_num_seqs=seqs,
        max_model_len=ctx,
        probes=a.probes + b.probes + 2 * plan.repeats * batch + plan.repeats,
        prompt_token_ratio=ratio,
    )
    longest = min(third, plan.max_prompt_tokens or third)  # the calibration's long prompt
    n = min(4 * chunk, int(ctx * LONG_SHARE)) if ctx else 0
    if n > LONG_OVER * longest:
        say(f"{rep.name}: a lone prompt of {n} tokens (attention's square)")
        counted, ttft = least_ttft(rep, n, plan, api_key=key)
        linear = max(a.longest_prompt_tokens or 0, b.longest_prompt_tokens or 0)
        fit = fit.model_copy(update={"linear_tokens": linear})  # the rate's own prompts
        attn = solve_attention(fit, counted, ttft)
        fit = fit.model_copy(
            update={
                "attn_s_per_pair": Measured(value=attn, rel_uncertainty=prefill_err),
                "probes": fit.probes + plan.repeats,
            }
        )
    return fit


def _measured(a: float, b: float, floor: float = 0.0) -> Measured:
    mean = (a + b) / 2
    spread = abs(a - b) / 2 / mean if mean > 0 else 0.0
    return Measured(value=mean, rel_uncertainty=max(spread, floor))


@dataclass(frozen=True)
class _Facts:
    """What the cluster file says of its replicas' engines."""

    max_num_seqs: int = VLLM_MAX_NUM_SEQS
    chunk_tokens: int = CHUNK_TOKENS
    shared_cpus: bool = False
    """The preset pins more servers than CPUs: they share them."""


def _replica_facts(state_dir: str) -> _Facts:
    """The vLLM preset's own flags (``vllm.max_num_seqs``, the token budget lbtune starts
    its servers with, whether they are pinned to fewer CPUs than there are servers); else
    vLLM's defaults (the simulator's too)."""
    data = read_config_json(StatePaths(Path(state_dir)))
    if data is None:
        return _Facts()
    v = parse_config(data, "the running cluster's config").vllm
    if v is None:
        return _Facts()
    chunk = ServerSettings(served_name=v.model).max_num_batched_tokens
    return _Facts(v.max_num_seqs, chunk, v.count > len(set(v.cpus)))


def _calibration(profile: TwinProfile) -> Calibration:
    """The fit as the ``llm`` scheduler's rates (``calibration.json``)."""
    return Calibration(
        measured_at=profile.measured_at,
        time_scale=profile.time_scale,
        replicas=[
            ReplicaRates(
                name=f.name,
                model=f.model,
                url=f.url,
                prefill_tokens_per_s=f.prefill_tokens_per_s.value,
                step_s=f.step_s.value,
                step_per_seq_s=f.step_per_seq_s.value,
                overhead_s=f.overhead_s.value,
                probes=f.probes,
                fit_error=f.prefill_tokens_per_s.rel_uncertainty,
            )
            for f in profile.replicas
        ],
    )
