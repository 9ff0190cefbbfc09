"""The embedded cluster: simulated replicas behind a real HAProxy, scraped by a real Prometheus.

* :mod:`lbtune.cluster.config` — the cluster YAML (pydantic models, loader, presets, ports).
* :mod:`lbtune.cluster.render` — HAProxy, Prometheus and sim-host configs from templates.
* :mod:`lbtune.cluster.supervisor` — start/stop processes by PID, readiness waits.
* :mod:`lbtune.cluster.probes` — HTTP, runtime-API and Prometheus probes.
* :mod:`lbtune.cluster.health` — readiness checks and the status records.
* :mod:`lbtune.cluster.state` — the state dir layout and the endpoints record.
* :mod:`lbtune.cluster.agent` — the feedback agent as a cluster component (``agent.enabled``).
* :mod:`lbtune.cluster.api` — ``up()``, ``down()``, ``status()``: what the CLI and the
  ``stress``/``optimize`` commands call.

Only the standard library, pydantic, PyYAML, jinja2 and psutil are imported here.
"""

from __future__ import annotations
