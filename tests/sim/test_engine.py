"""The continuous-batching engine: scheduling order, KV accounting, preemption, prefix cache."""

from __future__ import annotations

import dataclasses
import random

import pytest

from lbtune.sim import costmodel as cm
from lbtune.sim.engine import (
    Engine,
    EngineConfig,
    InvalidRequest,
    QueueFull,
    RequestTooLong,
    SimRequest,
    StepResult,
    UnknownModel,
)
from lbtune.sim.profiles import GIB, ModelProfile, get_gpu, get_model

H100 = get_gpu("h100-80g")
M8 = get_model("llama-3.1-8b-instruct")
M70 = get_model("llama-3.1-70b-instruct-awq")
BS = 16


def tiny_engine(blocks: int, models: tuple[ModelProfile, ...] = (M8,), **config: int) -> Engine:
    """An H100 whose KV cache holds exactly ``blocks`` blocks of the first model."""
    cfg = EngineConfig(**config)  # type: ignore[arg-type]
    bb = BS * models[0].kv_bytes_per_token
    weights = sum(m.weight_bytes for m in models)
    gib = (weights + blocks * bb + bb / 2) / cfg.gpu_memory_utilization / GIB
    engine = Engine(dataclasses.replace(H100, memory_gib=gib), models, cfg)
    assert engine.kv_capacity_blocks == blocks
    return engine


def req(
    rid: str, n_prompt: int, max_tokens: int, base: int = 0, model: str = M8.name
) -> SimRequest:
    return SimRequest(rid, model, list(range(base, base + n_prompt)), max_tokens)


def run(engine: Engine, limit: int = 100_000) -> list[StepResult]:
    steps = []
    while engine.has_work():
        steps.append(engine.step())
        assert len(steps) < limit
    return steps


def check(engine: Engine, step: StepResult) -> None:
    """Invariants that hold after every step."""
    engine.kv.check()
    assert 0 <= engine.kv.used_bytes <= engine.kv.capacity_bytes
    assert 0.0 <= engine.kv_usage <= 1.0
    assert engine.num_running <= engine.config.max_num_seqs
    assert step.num_prefill_tokens + step.num_decode_tokens <= engine.config.max_num_batched_tokens
    assert engine.memory_used_bytes <= engine.memory_total_bytes
    assert step.duration >= 0


def test_chunked_prefill_spans_steps_and_first_token_follows_the_last_chunk() -> None:
    engine = Engine(H100, [M8], EngineConfig(max_num_batched_tokens=2048))
    engine.add_request(req("a", 5000, 3))
    steps = run(engine)
    assert [s.num_prefill_tokens for s in steps] == [2048, 2048, 904, 0, 0]
    assert [s.num_decode_tokens for s in steps] == [0, 0, 0, 1, 1]
    assert [s.tokens for s in steps] == [{}, {}, {"a": 1}, {"a": 1}, {"a": 1}]
    assert steps[-1].finished == ("a",)
    assert steps[0].scheduled_first == ("a",) and steps[1].scheduled_first == ()
    # the second chunk attends to the first: it costs more than the first
    assert steps[1].duration > steps[0].duration


def test_decodes_are_scheduled_before_a_new_prefill() -> None:
    engine = Engine(H100, [M8], EngineConfig(max_num_batched_tokens=512))
    engine.add_request(req("a", 100, 10))
    engine.step()
    engine.add_request(req("b", 3000, 1, base=10_000))
    step = engine.step()
    assert step.tokens == {"a": 1}
    assert (step.num_decode_tokens, step.num_prefill_tokens) == (1, 511)
    assert step.scheduled_first == ("b",)


def test_waiting_queue_is_fifo_and_bounded_by_max_num_seqs() -> None:
    engine = Engine(H100, [M8], EngineConfig(max_num_seqs=2))
    for i in range(4):
        engine.add_request(req(f"r{i}", 10, 2, base=1000 * i))
    first = engine.step()
    assert first.scheduled_first == ("r0", "r1")
    assert (engine.num_running, engine.num_waiting) == (2, 2)
    second = engine.step()
    assert second.finished == ("r0", "r1") and second.scheduled_first == ()
    third = engine.step()
    assert third.scheduled_first == ("r2", "r3")


def test_admission_waits_for_free_blocks() -> None:
    engine = tiny_engine(8)
    engine.add_request(req("a", 100, 5))  # 7 blocks for its prompt
    engine.add_request(req("b", 40, 2, base=1000))  # 3 blocks: must wait for "a"
    step = engine.step()
    assert step.scheduled_first == ("a",) and engine.num_waiting == 1
    steps = run(engine)
    assert sum(1 for s in steps if "b" in s.scheduled_first) == 1
    assert engine.stats.requests_finished == 2 and engine.stats.num_preemptions == 0


def test_preemption_recomputes_the_newest_request_and_both_finish() -> None:
    engine = tiny_engine(4, max_num_batched_tokens=256)
    engine.add_request(req("old", 30, 30))  # grows from 2 to 4 blocks
    engine.add_request(req("new", 30, 30, base=1000))  # same: 4 + 4 > 4
    produced = {"old": 0, "new": 0}
    preempted: list[str] = []
    while engine.has_work():
        step = engine.step()
        check(engine, step)
        preempted += step.preempted
        for rid, n in step.tokens.items():
            produced[rid] += n
    assert preempted and set(preempted) == {"new"}
    assert engine.stats.num_preemptions == len(preempted)
    assert produced == {"old": 30, "new": 30}
    assert engine.stats.generation_tokens == 60 and engine.stats.requests_finished == 2
    assert engine.kv.used_bytes == 0


def test_preempted_request_goes_back_to_the_front_of_the_queue() -> None:
    engine = tiny_engine(4, max_num_batched_tokens=256, max_num_seqs=2)
    engine.add_request(req("old", 30, 30))
    engine.add_request(req("new", 30, 30, base=1000))
    engine.add_request(req("later", 5, 1, base=2000))
    while not engine.stats.num_preemptions:
        engine.step()
    assert [r.req.request_id for r in engine._waiting] == ["new", "later"]


def test_prefix_cache_hit_skips_prefill_and_is_cheaper() -> None:
    engine = Engine(H100, [M8])
    engine.add_request(req("a", 1000, 1))
    cold = engine.step()
    engine.add_request(req("b", 1000, 1))  # same prompt
    warm = engine.step()
    # 1000 tokens = 62 full blocks + 8; at most the full blocks below 999 tokens are hit
    assert cold.num_prefill_tokens == 1000
    assert warm.num_prefill_tokens == 1000 - 62 * 16
    assert warm.num_cached_tokens == {"b": 62 * 16}
    assert warm.duration < cold.duration
    assert engine.stats.prefix_cache_queries == 2000
    assert engine.stats.prefix_cache_hits == 992


def test_a_fully_cached_prompt_still_recomputes_its_last_token() -> None:
    engine = Engine(H100, [M8])
    engine.add_request(req("a", 64, 1))
    run(engine)
    engine.add_request(req("b", 64, 1))
    step = engine.step()
    assert step.num_prefill_tokens == 16  # blocks 0-2 hit, the last block recomputed
    assert engine.stats.prefix_cache_hits == 48


def test_prefix_caching_can_be_disabled() -> None:
    engine = Engine(H100, [M8], EngineConfig(enable_prefix_caching=False))
    for rid in ("a", "b"):
        engine.add_request(req(rid, 1000, 1))
        assert engine.step().num_prefill_tokens == 1000
    assert engine.stats.prefix_cache_hits == 0


def test_errors() -> None:
    engine = Engine(H100, [M8], EngineConfig(max_waiting=2))
    with pytest.raises(UnknownModel, match=r"llama-3\.1-8b-instruct"):
        engine.add_request(req("x", 10, 1, model="gpt-4"))
    with pytest.raises(RequestTooLong, match="maximum context length is 131072"):
        engine.add_request(req("x", 131000, 100))
    with pytest.raises(InvalidRequest):
        engine.add_request(req("x", 0, 1))
    with pytest.raises(InvalidRequest):
        engine.add_request(req("x", 10, 0))
    engine.add_request(req("a", 10, 1))
    with pytest.raises(InvalidRequest, match="Duplicate"):
        engine.add_request(req("a", 10, 1))
    engine.add_request(req("b", 10, 1))
    with pytest.raises(QueueFull):
        engine.add_request(req("c", 10, 1))
    assert issubclass(RequestTooLong, ValueError) and issubclass(UnknownModel, KeyError)
    small = tiny_engine(10)
    with pytest.raises(RequestTooLong, match="more KV cache"):
        small.add_request(req("x", 150, 20))
    capped = Engine(H100, [M8], EngineConfig(max_model_len=4096))
    with pytest.raises(RequestTooLong, match="4096"):
        capped.add_request(req("x", 4000, 100))


def test_abort_frees_blocks_and_ignores_unknown_ids() -> None:
    engine = Engine(H100, [M8])
    engine.add_request(req("a", 500, 100))
    engine.add_request(req("b", 500, 100, base=10_000))
    engine.step()
    used = engine.kv.used_bytes
    engine.abort("a")
    engine.abort("nope")
    assert engine.kv.used_bytes < used and engine.num_running == 1
    engine.add_request(req("c", 10, 1, base=20_000))
    engine.abort("c")
    assert engine.num_waiting == 0
    run(engine)
    assert engine.kv.used_bytes == 0 and engine.stats.requests_finished == 1


def random_workload(seed: int, n: int) -> list[tuple[int, SimRequest]]:
    """(step at which it arrives, request), with shared prefixes."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(50_000) for _ in range(rng.choice([16, 48, 200]))] for _ in range(4)]
    out = []
    for i in range(n):
        prefix = rng.choice(prefixes) if rng.random() < 0.5 else []
        body = [rng.randrange(50_000) for _ in range(rng.randint(1, 300))]
        out.append(
            (rng.randint(0, 60), SimRequest(f"r{i}", M8.name, prefix + body, rng.randint(1, 60)))
        )
    return sorted(out, key=lambda t: t[0])


def drive(
    engine: Engine, workload: list[tuple[int, SimRequest]], aborts: set[str]
) -> list[StepResult]:
    steps: list[StepResult] = []
    pending = list(workload)
    produced: dict[str, int] = {}
    while pending or engine.has_work():
        while pending and pending[0][0] <= len(steps):
            engine.add_request(pending.pop(0)[1])
        if len(steps) == 30:
            for rid in sorted(aborts):
                engine.abort(rid)
        step = engine.step()
        check(engine, step)
        for rid, k in step.tokens.items():
            produced[rid] = produced.get(rid, 0) + k
        steps.append(step)
        assert len(steps) < 50_000
    for _, r in workload:
        if r.request_id not in aborts:
            assert produced[r.request_id] == r.max_tokens, r.request_id
    return steps


def test_seeded_stress_keeps_invariants_and_finishes_everything() -> None:
    workload = random_workload(seed=7, n=120)
    aborts = {"r3", "r10", "r11"}
    engine = tiny_engine(60, max_num_batched_tokens=256, max_num_seqs=24)
    drive(engine, workload, aborts)
    assert engine.stats.num_preemptions > 0  # KV was tight
    assert engine.stats.prefix_cache_hits > 0
    assert engine.kv.used_bytes == 0 and not engine.has_work()
    assert engine.stats.requests_finished >= len(workload) - len(aborts)


def test_same_calls_give_the_same_results() -> None:
    def once() -> list[StepResult]:
        engine = tiny_engine(60, max_num_batched_tokens=256, max_num_seqs=24)
        return drive(engine, random_workload(seed=3, n=60), set())

    assert once() == once()


def test_one_engine_serves_two_models_from_one_pool() -> None:
    engine = Engine(H100, [M8, M70])
    assert engine.kv.block_bytes == (16 * 131072, 16 * 327680)
    engine.add_request(req("small", 320, 2))
    engine.add_request(req("big", 320, 2, model=M70.name))
    step = engine.step()
    assert step.tokens == {"small": 1, "big": 1}
    assert engine.kv.used_bytes == 20 * 16 * 131072 + 20 * 16 * 327680
    assert engine.memory_used_bytes == M8.weight_bytes + M70.weight_bytes + engine.kv.used_bytes
    expected = cm.step_time(H100, [(M8, cm.request_load(0, 320)), (M70, cm.request_load(0, 320))])
    assert step.duration == pytest.approx(expected)
    assert step.duration > cm.prefill_step_time(H100, M70, 320)
    # the same prompt under another model does not hit the other model's cache
    engine.add_request(req("small2", 320, 1))
    engine.step()
    assert engine.model_stats[M8.name].prefix_cache_hits == 304
    assert engine.model_stats[M70.name].prefix_cache_hits == 0
    run(engine)
    assert engine.model_stats[M70.name].requests_finished == 1
    assert engine.stats.requests_finished == 3
