"""One load test, the use case behind ``lbtune stress`` and every trial of a study.

plan (:mod:`~lbtune.run.plan`) → target (:mod:`~lbtune.run.target`) → sample estimate
(:mod:`~lbtune.run.samples`) → load, watched (:mod:`~lbtune.run.until`,
:mod:`~lbtune.run.replica_watch`) → summary (:mod:`~lbtune.run.summary`); wired together
by :func:`lbtune.run.stress.run_stress`.
"""
