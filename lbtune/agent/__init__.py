"""The LLM-aware feedback agent (``lbtune agent``): live balancer weights from replica load.

Every interval it reads each replica's KV-cache usage, waiting queue, running requests
and recent TTFT from Prometheus (:mod:`~lbtune.agent.source`), scores the replicas and
turns the scores into weights with guard rails (:mod:`~lbtune.agent.scoring`, pure),
pushes the changed weights through the balancer's live-weights hook (any registered target
with ``live_weights``, e.g. HAProxy's runtime API) and exports its own metrics
(:mod:`~lbtune.agent.loop`, :mod:`~lbtune.agent.exporter`). See ``docs/agent.md``.
The package imports no balancer: the actuator is handed in (``lbtune.cli.agent``).
"""
