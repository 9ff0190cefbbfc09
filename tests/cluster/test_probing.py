"""What a replica says of itself (lbtune/cluster/probing.py); the probes' requests are
measured against simulated replicas in tests/cluster/test_calibrate.py."""

from __future__ import annotations

from lbtune.cluster.probing import parse_cache_info


def test_cache_info_is_parsed_from_an_exposition_or_said_absent() -> None:
    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="40",cache_dtype="auto"} 1.0\n'
    )
    assert parse_cache_info(text) == (16, 40)
    assert parse_cache_info("# TYPE ps_running gauge\nps_running 0\n") is None
    assert parse_cache_info("not an exposition {") is None
