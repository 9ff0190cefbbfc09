"""The vllm-router target: policy and cache-aware thresholds, applied by restart.

See :mod:`lbtune.targets.vllm_router.target` and ``docs/vllm-router.md``.
"""
