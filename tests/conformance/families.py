"""The metric families a replica serves on ``/metrics``: the simulator's contract with vLLM.

One table for the conformance suite (simulator and real vLLM alike) and the simulator's own
exposition tests (``tests/sim/test_metrics.py``).
"""

from __future__ import annotations

VLLM_TYPES: dict[str, str] = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries_total": "counter",
    "vllm:prefix_cache_hits_total": "counter",
    "vllm:num_preemptions_total": "counter",
    "vllm:prompt_tokens_total": "counter",
    "vllm:generation_tokens_total": "counter",
    "vllm:request_success_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
}
"""Every vLLM family the simulator writes, with its type (a superset of what lbtune reads)."""

VLLM_ONLY: dict[str, str] = {
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:iteration_tokens_total": "histogram",
}
"""vLLM families the simulator does not write, which ``lbtune twin fit`` reads where a
replica exports them (its engine's view while kept busy): real vLLM must, with their type."""

INFO_GAUGES: tuple[str, ...] = ("vllm:cache_config_info",)
"""vLLM's info gauges (value 1, the facts in labels, no ``model_name``): the KV cache's
``block_size`` and ``num_gpu_blocks``, which ``lbtune twin fit`` reads."""

DCGM_GAUGES: tuple[str, ...] = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
)
"""dcgm-exporter's GPU gauges, which the simulator serves beside vLLM's families."""
