"""``lbtune compare``: two runs or a study's before/after, figure by figure, beyond the noise.

The sides are read from their reports (:mod:`~lbtune.compare.verdict.sources`); the verdict is
:func:`lbtune.compare.verdict.verdict.compare`.
"""
