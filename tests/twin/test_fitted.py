"""A replica simulated from fitted rates (lbtune/twin/fitted.py): the step formula on
hand-made batches, the engine's KV size, the profile file, and — where the rates are the
cost model's own — the same figures as the GPU profile's twin."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from lbtune.cluster.twin import twin_cluster, twin_params
from lbtune.errors import ConfigError
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions
from lbtune.sim.batch import BatchLoad
from lbtune.sim.costmodel import (
    decode_step_time,
    engine_rates,
    request_load,
    request_overhead_s,
    step_time,
)
from lbtune.sim.engine import Engine, SimRequest
from lbtune.sim.profiles import get_gpu, get_model
from lbtune.tune.virtual import twin_figures
from lbtune.twin.fitted import (
    Measured,
    ReplicaFit,
    TwinProfile,
    Validation,
    drift,
    engine_parts,
    expand_tokens,
    lone_ttft,
    read_profile,
    solve_attention,
    step_cost,
    trusted_profile,
)
from lbtune.twin.replica import ReplicaSim, TwinReplica
from lbtune.twin.run import simulate

M8 = "llama-3.1-8b-instruct"


def _m(v: float) -> Measured:
    return Measured(value=v, rel_uncertainty=0.0)


def fit(name: str = "r", **kw: object) -> ReplicaFit:
    base: dict[str, object] = {
        "name": name,
        "model": M8,
        "url": "http://127.0.0.1:9",
        "prefill_tokens_per_s": _m(10_000.0),
        "step_s": _m(0.02),
        "step_per_seq_s": _m(0.001),
        "overhead_s": _m(0.005),
        "kv_s_per_token": _m(1e-6),
        "kv_tokens": 4096,
    }
    return ReplicaFit.model_validate(base | kw)


def test_step_formula_on_hand_made_batches() -> None:
    cost = step_cost(fit(), time_scale=2.0)  # model seconds: wall x 2
    lone = BatchLoad(1)
    lone.add(0, 0, 1000, decode=False)  # a fresh 1000-token prompt, alone
    assert cost(lone).duration == pytest.approx(2.0 * math.hypot(0.02, 1000 / 10_000))
    batch = BatchLoad(1)
    for ctx in (100, 300, 500):  # three decodes reading 101, 301, 501 tokens of context
        batch.add(0, ctx, 1, decode=True)
    want = 0.02 + 0.001 * 2 + 1e-6 * (101 + 301 + 501)
    assert cost(batch).duration == pytest.approx(2.0 * want)
    assert cost(batch).compute_s == 0.0
    mixed = BatchLoad(1)
    mixed.add(0, 0, 512, decode=False)
    mixed.add(0, 40, 1, decode=True)
    assert cost(mixed).duration == pytest.approx(  # KV reads are not hidden by the GEMMs
        2.0 * (math.hypot(0.02 + 0.001, 512 / 10_000) + 1e-6 * 41)
    )
    later = BatchLoad(1)  # a chunk after 4096 cached tokens: to them and to itself
    later.add(0, 4096, 1024, decode=False)
    with_attention = step_cost(fit(attn_s_per_pair=_m(1e-9)), time_scale=1.0)
    assert with_attention(later).duration == pytest.approx(
        math.hypot(0.02, 1024 / 10_000) + 1e-6 * 4096 + 1e-9 * (1024 * 4096 + 1024 * 1025 / 2)
    )
    assert cost(BatchLoad(1)).duration == 0.0


def test_the_engine_holds_the_fitted_kv_and_limits() -> None:
    f = fit(kv_tokens=4096, max_num_seqs=3, block_size=16)
    gpu, model, cfg = engine_parts(f, 1.0)
    eng = Engine(gpu, [model], cfg, step_cost(f, 1.0))
    assert 4096 <= eng.kv_capacity_bytes < 4096 + 2 * 16  # one byte a token
    for i in range(5):
        eng.add_request(SimRequest(f"q{i}", M8, list(range(i * 1000, i * 1000 + 64)), 4))
    res = eng.step()
    assert res.batch_size == 3  # max_num_seqs
    assert res.duration == pytest.approx(math.hypot(0.02 + 0.002, 3 * 64 / 10_000))
    assert request_overhead_s(gpu, model) == pytest.approx(0.005)
    g2, m2, c2 = engine_parts(fit(kv_tokens=None), 1.0)
    unbounded = Engine(g2, [m2], c2)
    assert unbounded.kv_capacity_bytes > 10**8


def _cost_model_fit(name: str, gpu: str, scale: float) -> ReplicaFit:
    """The rates the cost model itself gives, in wall seconds at time scale ``scale``
    (what a perfect measurement of the simulated replica would find)."""
    g, m = get_gpu(gpu), get_model(M8)
    r = engine_rates(g, m)
    kv = (decode_step_time(g, m, 1024, 8) - decode_step_time(g, m, 16, 8)) / (8 * 1008)
    slope = max(0.0, (decode_step_time(g, m, 16, 8) - r.step_s) / 7)
    base = fit(
        name,
        prefill_tokens_per_s=_m(r.prefill_tokens_per_s * scale),
        step_s=_m(r.step_s / scale),
        step_per_seq_s=_m(slope / scale),
        overhead_s=_m(r.request_overhead_s / scale),
        kv_s_per_token=_m(kv / scale),
        kv_tokens=None,
        linear_tokens=2048,  # engine_rates' prefill rate is a 2048-token chunk's
    )
    long = 4 * 2048  # a lone 8192-token prompt: four chunks, the later ones attending back
    ttft = r.request_overhead_s + sum(
        step_time(g, [(m, request_load(2048 * k, 2048))]) for k in range(4)
    )
    a = solve_attention(base, long, ttft / scale)
    assert lone_ttft(base, long, a) == pytest.approx(ttft / scale, rel=1e-6)
    return base.model_copy(update={"attn_s_per_pair": _m(a)})


@pytest.mark.parametrize("scenario", ["chat", "longctx"])
def test_fitted_twin_matches_the_gpu_profiles_twin(scenario: str) -> None:
    """With the cost model's own rates, the fitted replicas' twin gives the figures the
    roofline's twin gives on the same plan (the fitted form loses little: measured within
    4 % on chat, 15 % on longctx's P99 TTFT, whose mixed steps the roofline costs term by
    term)."""
    profile = TwinProfile(
        measured_at="x",
        cluster="mini2",
        time_scale=4.0,
        replicas=[
            _cost_model_fit("h100-0", "h100-80g", 4.0),
            _cost_model_fit("l4-0", "l4-24g", 4.0),
        ],
    )
    gpu_tc = twin_cluster("mini2")
    fit_tc = twin_cluster("mini2", profile=profile)
    assert all(r.fit is not None for r in fit_tc.replicas)
    plan = plan_run(StressOptions(scenario=scenario, duration_s=40, seed=3))
    params = {"algorithm": "leastconn"}
    figs = []
    for tc in (gpu_tc, fit_tc):
        full = dict(twin_params(tc)[0]) | params
        run = simulate(plan, tc.replicas, tc.routing(full, seed=plan.seed), tc.options())
        figs.append(twin_figures(run)[0])
    gpu_fig, fit_fig = figs
    for m in ("p99_e2e_s", "p99_ttft_s", "requests_per_s"):
        a, b = getattr(fit_fig, m), getattr(gpu_fig, m)
        assert a == pytest.approx(b, rel=0.2), (m, a, b)


def test_profile_round_trip_and_bad_files(tmp_path: Path) -> None:
    val = Validation(
        scenario="chat",
        duration_s=30,
        runs=2,
        live={"p99_e2e_s": 10.0},
        twin={"p99_e2e_s": 14.0},
        errors={"p99_e2e_s": 0.4},
        live_spread={"p99_e2e_s": 0.3},
    )
    prof = TwinProfile(measured_at="x", cluster="c", time_scale=1.0, replicas=[fit()])
    p = prof.model_copy(update={"validation": val}).write(tmp_path / "p.json")
    back = read_profile(p)
    assert back.replicas == prof.replicas and back.validation == val
    why = back.trusted(0.25)
    assert why is not None and "missed p99_e2e_s by 40%" in why and "differed by 30%" in why
    assert back.trusted(0.5) is None
    assert prof.trusted() is not None and "no validation" in (prof.trusted() or "")
    with pytest.raises(ConfigError, match=r"not trusted: .* or --screen 0"):
        trusted_profile(p, 0.25, "--screen 0")
    assert trusted_profile(p, 0.5, "-").replicas == prof.replicas
    with pytest.raises(ConfigError, match="no such file"):
        read_profile(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text(json.dumps({"version": 1}))
    with pytest.raises(ConfigError, match="not a twin profile"):
        read_profile(tmp_path / "bad.json")


def test_a_fitted_replica_is_simulated_from_its_fit() -> None:
    """External replicas without a fit are refused (one line naming them); with one, the
    twin simulates them from it and serves only the fitted model."""
    tc = twin_cluster("mini2", profile=TwinProfile(
        measured_at="x", cluster="mini2", time_scale=4.0, replicas=[fit("l4-0")]
    ))  # fmt: skip
    l4 = next(r for r in tc.replicas if r.name == "l4-0")
    assert l4.fit is not None and l4.models == (M8,)
    h100 = next(r for r in tc.replicas if r.name == "h100-0")
    assert h100.fit is None and h100.gpu == "h100-80g"
    assert dataclasses.replace(l4, fit=None) == TwinReplica("l4-0", "", (M8,))


def test_a_busy_replica_charges_its_busy_front_end() -> None:
    """A request arriving while others run (``in_flight`` counts it) waits the busy
    overhead where the fit measured one; alone, or without one, the idle overhead."""
    busy = ReplicaSim(TwinReplica("r", "", (M8,), fit=fit(busy_overhead_s=_m(0.05))), 4.0)
    idle = ReplicaSim(TwinReplica("r", "", (M8,), fit=fit()), 4.0)
    for rs in (busy, idle):
        rs.in_flight = 1
        assert rs.overhead_s(M8) == pytest.approx(0.005)
        rs.in_flight = 3
    assert busy.overhead_s(M8) == pytest.approx(0.05)
    assert idle.overhead_s(M8) == pytest.approx(0.005)


def test_prompts_are_counted_as_the_replicas_tokenizer_counts_them() -> None:
    """A replica counting 1.5 tokens per lbtune token holds 1.5x the prompt (its KV and its
    prefill), and two prompts sharing a prefix still share it there."""
    a, b = list(range(100)), [*range(60), *range(1000, 1040)]
    ea, eb = expand_tokens(a, 1.5), expand_tokens(b, 1.5)
    assert len(ea) == 150 and len(eb) == 150 and len(set(ea)) == 150
    assert ea[:90] == eb[:90] and ea[90] != eb[90]  # floor(60 x 1.5) shared
    assert expand_tokens(a, 1.0) is a
    wide = ReplicaSim(TwinReplica("r", "", (M8,), fit=fit(prompt_token_ratio=1.5)), 1.0)
    plain = ReplicaSim(TwinReplica("r", "", (M8,), fit=fit()), 1.0)
    for rs in (wide, plain):
        assert rs.admit(SimRequest("x", M8, a, 4)) is None
        rs.start_step(0.0)
    # KV blocks of 16 tokens: 150 tokens take 10, 100 take 7
    assert wide.engine.kv_usage / plain.engine.kv_usage == pytest.approx(10 / 7)


def test_drift_names_the_replica_that_got_slower() -> None:
    old = TwinProfile(measured_at="x", cluster="c", time_scale=1.0, replicas=[fit("a"), fit("b")])
    slow = fit("a", step_s=_m(0.026), prefill_tokens_per_s=_m(8_000.0))
    noisy = fit("b", step_s=Measured(value=0.0205, rel_uncertainty=0.05))
    new = old.model_copy(update={"replicas": [slow, noisy]})
    by = {d.replica: d for d in drift(old, new)}
    assert by["a"].decode == pytest.approx(0.3) and by["a"].prefill == pytest.approx(0.25)
    assert by["a"].slower == pytest.approx(0.3) and by["a"].beyond_noise
    assert by["b"].decode == pytest.approx(0.025) and not by["b"].beyond_noise
    with pytest.raises(ConfigError, match="time scale 1, this cluster runs at 4"):
        drift(old, new.model_copy(update={"time_scale": 4.0}))
