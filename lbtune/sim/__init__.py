"""Simulated vLLM-compatible replicas: they stand in for GPUs, nothing else.

* :mod:`lbtune.sim.profiles` — GPU and model profiles (calibrated figures).
* :mod:`lbtune.sim.costmodel` — time of one engine step on one GPU.
* :mod:`lbtune.sim.kvcache` — paged KV-cache blocks with prefix caching.
* :mod:`lbtune.sim.engine` — continuous-batching scheduler (vLLM-like).
* :mod:`lbtune.sim.server` — OpenAI-compatible HTTP API, metrics, ground truth.
* :mod:`lbtune.sim.host` — ``python -m lbtune.sim``: several replicas in one process.
* :mod:`lbtune.sim.spec` — the replica spec shared with :mod:`lbtune.cluster`.
"""
