"""The LLM-aware feedback agent (``lbtune agent``): HAProxy weights from live replica load.

Every interval it reads each replica's KV-cache usage, waiting queue, running requests
and recent TTFT from Prometheus (:mod:`~lbtune.agent.source`), scores the replicas and
turns the scores into weights with guard rails (:mod:`~lbtune.agent.scoring`, pure),
pushes the changed weights through HAProxy's runtime API and exports its own metrics
(:mod:`~lbtune.agent.loop`, :mod:`~lbtune.agent.exporter`). See ``docs/agent.md``.
"""
