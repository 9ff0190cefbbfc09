"""What a replica says of itself (lbtune/cluster/probing.py); the probes' requests are
measured against simulated replicas in tests/cluster/test_calibrate.py."""

from __future__ import annotations

import pytest

from lbtune.cluster.probing import histogram_totals, parse_cache_info


def test_cache_info_is_parsed_from_an_exposition_or_said_absent() -> None:
    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="40",cache_dtype="auto"} 1.0\n'
    )
    assert parse_cache_info(text) == (16, 40)
    assert parse_cache_info("# TYPE ps_running gauge\nps_running 0\n") is None
    assert parse_cache_info("not an exposition {") is None


def test_vllms_histograms_are_summed_over_their_label_sets() -> None:
    text = (
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{model_name="a",le="+Inf"} 3.0\n'
        'vllm:time_to_first_token_seconds_sum{model_name="a"} 0.3\n'
        'vllm:time_to_first_token_seconds_count{model_name="a"} 3.0\n'
        'vllm:time_to_first_token_seconds_bucket{model_name="b",le="+Inf"} 1.0\n'
        'vllm:time_to_first_token_seconds_sum{model_name="b"} 0.5\n'
        'vllm:time_to_first_token_seconds_count{model_name="b"} 1.0\n'
        "# TYPE ps_running gauge\nps_running 2\n"
    )
    got = histogram_totals(text)
    assert set(got) == {"ttft"}  # no queue or token-interval histogram: left out
    assert got["ttft"] == pytest.approx((0.8, 4.0))
    assert histogram_totals("not an exposition {") == {}
