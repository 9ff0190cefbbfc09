"""The embedded cluster: simulated replicas behind a real balancer, scraped by a real Prometheus.

The balancer is the cluster YAML's ``balancer:`` (a name of :data:`lbtune.targets.TARGETS`,
HAProxy by default); its registry entry launches, watches and scrapes it
(:class:`lbtune.targets.targetbase.BalancerBase`). Nothing here names a balancer.

* :mod:`lbtune.cluster.config` — the cluster YAML (pydantic models, loader, presets).
* :mod:`lbtune.cluster.resolve` — a valid config made concrete: replica names, ports, URLs.
* :mod:`lbtune.cluster.render` — Prometheus and sim-host configs; the shared template renderer.
* :mod:`lbtune.process.supervisor` — start/stop processes by PID, readiness waits, and the
  :class:`~lbtune.process.supervisor.ClusterSupervisor` a balancer's launch uses.
* :mod:`lbtune.process.probes` — HTTP, port and Prometheus probes.
* :mod:`lbtune.process.affinity` — the CPUs the rest runs on beside pinned vLLM servers.
* :mod:`lbtune.cluster.health` — readiness checks and the status records.
* :mod:`lbtune.records.statedir` — the state dir layout and the endpoints record.
* :mod:`lbtune.cluster.agent` — the feedback agent as a cluster component (``agent.enabled``).
* :mod:`lbtune.cluster.heal` — a dead balancer relaunched on its last known good.
* :mod:`lbtune.cluster.keeper` — the component that does so between commands, unasked.
* :mod:`lbtune.cluster.api` — ``up()``, ``down()``, ``status()``: what the CLI and the
  ``stress``/``optimize`` commands call.

Only the standard library, pydantic, PyYAML, jinja2 and psutil are imported here.
"""

from __future__ import annotations
