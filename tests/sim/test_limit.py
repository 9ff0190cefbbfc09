"""The no-queueing limit (lbtune.sim.limit) against sums of the cost model's own steps."""

from __future__ import annotations

import pytest

from lbtune.errors import ConfigError
from lbtune.sim.costmodel import (
    decode_step_time,
    prefill_step_time,
    request_load,
    request_overhead_s,
    step_time,
)
from lbtune.sim.limit import ReplicaSpec, alone, fastest
from lbtune.sim.profiles import get_gpu, get_model

M8 = "llama-3.1-8b-instruct"
H100, L4 = get_gpu("h100-80g"), get_gpu("l4-24g")
MODEL = get_model(M8)


def test_a_short_request_is_overhead_one_prefill_step_and_its_decodes() -> None:
    ttft, e2e = alone(H100, MODEL, 100, 3)
    want_ttft = request_overhead_s(H100, MODEL) + prefill_step_time(H100, MODEL, 100)
    assert ttft == pytest.approx(want_ttft)
    # tokens 2 and 3: decodes over 100 and 101 tokens of KV
    want = want_ttft + decode_step_time(H100, MODEL, 100) + decode_step_time(H100, MODEL, 101)
    assert e2e == pytest.approx(want)


def test_one_output_token_ends_at_the_first_token() -> None:
    ttft, e2e = alone(L4, MODEL, 700, 1)
    assert e2e == ttft
    assert alone(L4, MODEL, 700, 0) == (ttft, e2e)


def test_a_long_prompt_is_prefilled_in_chunks_of_the_step_budget() -> None:
    ttft, _ = alone(H100, MODEL, 5000, 1, chunk_tokens=2048)
    chunks = [(0, 2048), (2048, 2048), (4096, 904)]
    want = request_overhead_s(H100, MODEL) + sum(
        step_time(H100, [(MODEL, request_load(done, q))]) for done, q in chunks
    )
    assert ttft == pytest.approx(want)
    one_step, _ = alone(H100, MODEL, 5000, 1, chunk_tokens=8192)
    assert one_step != pytest.approx(ttft)  # the chunking is in the sum


def test_the_fastest_replica_that_serves_the_model_wins_and_time_scale_divides() -> None:
    reps = [
        ReplicaSpec("l4-0", "l4-24g", (M8,)),
        ReplicaSpec("h100-0", "h100-80g", (M8,)),
        ReplicaSpec("other", "h100-80g", ("some-other-model",)),
    ]
    best = fastest(reps, M8, 1000, 50)
    assert best is not None and best.replica == "h100-0"
    assert (best.ttft_s, best.e2e_s) == pytest.approx(alone(H100, MODEL, 1000, 50))
    assert alone(L4, MODEL, 1000, 50)[1] > best.e2e_s
    fast = fastest(reps, M8, 1000, 50, time_scale=4.0)
    assert fast is not None and fast.e2e_s == pytest.approx(best.e2e_s / 4)
    assert fastest(reps, "unserved", 10, 10) is None


def test_unknown_profiles_and_empty_prompts_are_refused() -> None:
    with pytest.raises(ConfigError):
        fastest([ReplicaSpec("x", "no-such-gpu", (M8,))], M8, 10, 10)
    with pytest.raises(ValueError):
        alone(H100, MODEL, 0, 10)
