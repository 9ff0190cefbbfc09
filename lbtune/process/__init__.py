"""Child processes lbtune starts: supervision by PID file with identity checks
(:mod:`~lbtune.process.supervisor`) and readiness probes (:mod:`~lbtune.process.probes`).

Shared by the embedded cluster (replicas, Prometheus, the agent) and the targets (each
launches its own balancer)."""
