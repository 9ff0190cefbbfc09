"""The replica gauge probe reads the exposition through prometheus_client's parser."""

from __future__ import annotations

from lbtune.process.probes import gauge_sums

TEXT = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 3.0
vllm:num_requests_running{model_name="b,\\"c\\""} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="a"} 0.25
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="a"} 100.0
"""


def test_sums_each_gauge_over_label_sets() -> None:
    names = ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting")
    assert gauge_sums(TEXT, names) == {
        "vllm:num_requests_running": 5.0,
        "vllm:kv_cache_usage_perc": 0.25,
    }


def test_a_bad_line_keeps_what_came_before() -> None:
    text = TEXT + "vllm:num_requests_waiting{model_name= 7\n"
    got = gauge_sums(text, ("vllm:num_requests_running", "vllm:num_requests_waiting"))
    assert got == {"vllm:num_requests_running": 5.0}
