"""Child processes lbtune starts: supervision by PID file with identity checks
(:mod:`~lbtune.process.supervisor`), readiness probes (:mod:`~lbtune.process.probes`) and
the CPUs they run on beside pinned servers (:mod:`~lbtune.process.affinity`).

Shared by the embedded cluster (replicas, Prometheus, the agent) and the targets (each
launches its own balancer)."""
