"""The shared records at the bottom of lbtune: what every stage passes around.

Replica addresses and a running cluster's endpoints (:mod:`~lbtune.records.endpoints`),
its state dir (:mod:`~lbtune.records.statedir`), one request's measurement
(:mod:`~lbtune.records.requests`), the one percentile estimator
(:mod:`~lbtune.records.quantiles`) and the SLO (:mod:`~lbtune.records.slo`). This package
imports nothing of lbtune's but the foundations (errors, keyvalue).
"""
