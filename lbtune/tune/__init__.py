"""A tuning study, the use case behind ``lbtune optimize``.

Options (:mod:`~lbtune.tune.options`) → the real harness a study runs against, with its
measurement (:mod:`~lbtune.tune.harness`) → the study, confirmation and rollout
(:func:`lbtune.tune.optimize.run_optimize`, over :mod:`lbtune.search`).
"""
