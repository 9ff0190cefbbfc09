"""Metrics: exact statistics over per-request records, PromQL collection, cross-checks.

Modules (import the one you need; this package imports nothing heavy on its own):

* :mod:`lbtune.metrics.summary` — the frozen dataclasses of ``summary.json``.
* :mod:`lbtune.records.quantiles` — percentiles and their sample-count rule.
* :mod:`lbtune.metrics.stats` — window, throughput, goodput, outcomes, replicas,
  :func:`~lbtune.metrics.stats.summarize`.
* :mod:`lbtune.metrics.stages` — per-stage figures, throughput decay, knee, recovery.
* :mod:`lbtune.metrics.promql` — PromQL builders (pure strings).
* :mod:`lbtune.metrics.prom` — the Prometheus client wrapper.
* :mod:`lbtune.metrics.serverside` — :func:`~lbtune.metrics.serverside.collect`.
* :mod:`lbtune.metrics.crosscheck` — records against Prometheus.

Definitions are in ``docs/metrics.md``.
"""
