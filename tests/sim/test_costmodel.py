"""The cost model against the calibration figures of docs/simulator.md, and its shape."""

from __future__ import annotations

import pytest

from lbtune.errors import ConfigError
from lbtune.sim import costmodel as cm
from lbtune.sim.engine import Engine, SimRequest
from lbtune.sim.profiles import GPU_PROFILES, MODEL_PROFILES, get_gpu, get_model

H100 = get_gpu("h100-80g")
A100 = get_gpu("a100-80g")
L4 = get_gpu("l4-24g")
M8 = get_model("llama-3.1-8b-instruct")
M70 = get_model("llama-3.1-70b-instruct-awq")

# (gpu, figure, low, high) in milliseconds (ms/token for the per-token figure).
# ITL is a decode step of one request in the middle of a 256-in/128-out answer.
CALIBRATION = [
    ("h100-80g", "ttft_256", 60.0, 120.0),
    ("a100-80g", "ttft_256", 100.0, 180.0),
    ("h100-80g", "itl", 10.0, 15.0),
    ("a100-80g", "itl", 15.0, 25.0),
    ("h100-80g", "prefill_ms_per_token_256", 0.15, 0.30),
    ("a100-80g", "prefill_ms_per_token_256", 0.30, 0.55),
    ("h100-80g", "linear_1024", 21.0 * 0.95, 21.0 * 1.05),
    ("a100-80g", "linear_1024", 70.0 * 0.95, 70.0 * 1.05),
    ("h100-80g", "linear_1", 5.6 * 0.95, 5.6 * 1.05),
    ("a100-80g", "linear_1", 9.5 * 0.95, 9.5 * 1.05),
]


def figure(gpu_name: str, name: str) -> float:
    gpu = get_gpu(gpu_name)
    if name == "ttft_256":
        return 1000 * cm.ttft_batch1(gpu, M8, 256)
    if name == "itl":
        return 1000 * cm.decode_step_time(gpu, M8, 256 + 64)
    if name == "prefill_ms_per_token_256":
        return cm.prefill_ms_per_token(gpu, M8, 256)
    if name == "linear_1024":
        return 1000 * cm.linear_time(gpu, M8, 1024)
    if name == "linear_1":
        return 1000 * cm.linear_time(gpu, M8, 1)
    raise AssertionError(name)


@pytest.mark.parametrize(("gpu", "name", "low", "high"), CALIBRATION)
def test_calibration_points(gpu: str, name: str, low: float, high: float) -> None:
    assert low <= figure(gpu, name) <= high


def test_ttft_through_the_engine_matches_the_cost_model() -> None:
    engine = Engine(H100, [M8])
    engine.add_request(SimRequest("a", M8.name, list(range(256)), 2))
    step = engine.step()
    assert step.tokens == {"a": 1}
    ttft = cm.request_overhead_s(H100, M8) + step.duration
    assert ttft == pytest.approx(cm.ttft_batch1(H100, M8, 256))


def test_l4_is_derived_from_a100_by_bandwidth_and_flops() -> None:
    mem_ratio = cm.linear_time(L4, M8, 1) / cm.linear_time(A100, M8, 1)
    assert mem_ratio == pytest.approx(A100.mem_bandwidth / L4.mem_bandwidth)
    flop_ratio = cm.linear_time(L4, M8, 1024) / cm.linear_time(A100, M8, 1024)
    assert flop_ratio == pytest.approx(A100.peak_bf16_tflops / L4.peak_bf16_tflops)
    assert L4.step_overhead_s == A100.step_overhead_s


def test_70b_awq_size_and_placement() -> None:
    assert 38e9 <= M70.weight_bytes <= 41e9
    assert M70.kv_bytes_per_token == 2.5 * M8.kv_bytes_per_token
    Engine(H100, [M8, M70])  # fits next to the 8B model on an 80 GB card
    Engine(A100, [M70])
    with pytest.raises(ConfigError, match="do not fit on l4-24g"):
        Engine(L4, [M70])
    # decode is memory bound: the 70B-int4 step costs its weight bytes, not its params
    ratio = cm.linear_time(H100, M70, 1) / cm.linear_time(H100, M8, 1)
    assert ratio == pytest.approx(M70.weight_bytes / M8.weight_bytes)
    # prefill is compute bound: the params count
    ratio = cm.linear_time(H100, M70, 4096) / cm.linear_time(H100, M8, 4096)
    assert ratio == pytest.approx(M70.params / M8.params)


def test_decode_step_by_hand() -> None:
    # one request, 1000 tokens of context, one new token on the H100
    load = cm.request_load(1000, 1)
    assert (load.tokens, load.kv_read_tokens, load.attn_pairs) == (1, 1001, 1001.0)
    memory = (M8.weight_bytes + 1001 * 131072) / (3350e9 * H100.bw_efficiency)
    attention = 1001 * 4 * 32 * 4096 / (989.4e12 * 0.5)
    expected = H100.step_overhead_s + memory + attention
    assert cm.decode_step_time(H100, M8, 1000) == pytest.approx(expected)


def test_empty_step_is_free_and_overhead_is_paid_once() -> None:
    assert cm.step_time(H100, []) == 0.0
    assert cm.step_time(H100, [(M8, cm.ModelLoad(0))]) == 0.0
    a = cm.request_load(0, 100)
    b = cm.request_load(500, 1)
    both = cm.step_time(H100, [(M8, a), (M70, b)])
    expected = H100.step_overhead_s + cm.model_time(H100, M8, a) + cm.model_time(H100, M70, b)
    assert both == pytest.approx(expected)


def test_attention_grows_with_context_and_cache_hits_are_not_charged() -> None:
    short = cm.decode_step_time(H100, M8, 100)
    long = cm.decode_step_time(H100, M8, 30000)
    assert long > short
    # 64 batched decodes at 4k context are dominated by reading their KV
    many = cm.ModelLoad(64, 64 * 4096, 64 * 4096)
    assert cm.model_time(H100, M8, many) > 2 * cm.linear_time(H100, M8, 64)
    # a 4096-token prompt whose first 4000 tokens are cached costs far less than a full one
    cold = cm.step_time(H100, [(M8, cm.request_load(0, 4096))])
    warm = cm.step_time(H100, [(M8, cm.request_load(4000, 96))])
    assert warm < cold / 3


def test_request_overhead_is_exposed_per_gpu() -> None:
    assert cm.request_overhead_s(H100, M8) == H100.request_overhead_s
    assert 0 < H100.request_overhead_s < A100.request_overhead_s


def test_profile_lookup_errors_list_the_choices() -> None:
    assert set(GPU_PROFILES) >= {"h100-80g", "a100-80g", "l4-24g"}
    assert set(MODEL_PROFILES) >= {"llama-3.1-8b-instruct", "llama-3.1-70b-instruct-awq"}
    with pytest.raises(ConfigError) as err:
        get_gpu("h200")
    assert str(err.value) == "Unknown GPU profile 'h200'. Available: a100-80g, h100-80g, l4-24g"
    with pytest.raises(ConfigError, match=r"Available: llama-3\.1-70b-instruct-awq, llama-3\.1-8b"):
        get_model("gpt-4")
