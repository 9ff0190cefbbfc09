"""Simulated vLLM-compatible replicas: they stand in for GPUs, nothing else.

* :mod:`lbtune.sim.profiles` — GPU and model profiles (calibrated figures).
* :mod:`lbtune.sim.costmodel` — time of one engine step on one GPU.
* :mod:`lbtune.sim.kvcache` — paged KV-cache blocks with prefix caching.
* :mod:`lbtune.sim.engine` — continuous-batching scheduler (vLLM-like).
* :mod:`lbtune.sim.server` — OpenAI-compatible HTTP API, sim knobs, ground truth.
* :mod:`lbtune.sim.metrics` — vLLM- and DCGM-named metrics, the ground-truth log.
* :mod:`lbtune.sim.textgen` — request parsing, output length and text, SSE frames.
* :mod:`lbtune.sim.router_api` — the worker endpoints vllm-router calls.
* :mod:`lbtune.sim.host` — ``python -m lbtune.sim``: several replicas in one process.
* :mod:`lbtune.sim.spec` — the replica spec shared with :mod:`lbtune.cluster`.
"""
