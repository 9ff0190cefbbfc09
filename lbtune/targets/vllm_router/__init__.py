"""vllm-router as an lbtune target: policy and cache-aware thresholds, applied by restart.

* :mod:`~lbtune.targets.vllm_router.balancer` — the registry entry (launch, health, scrape).
* :mod:`~lbtune.targets.vllm_router.target` — :class:`VllmRouterTarget`.
* :mod:`~lbtune.targets.vllm_router.process` — command line, start/restart, read-back.

See ``docs/vllm-router.md``.
"""
