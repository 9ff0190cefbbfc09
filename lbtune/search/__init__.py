"""The search: an Optuna study (ask/tell) over a target's parameter space.

:mod:`.study` (storage, references, loop), :mod:`.trial` (one trial), :mod:`.measure`
(the real measurement), :mod:`.pruning`, :mod:`.confirm` (interleaved re-runs and the
bootstrap verdict), :mod:`.harness` (what a study runs against, and the rollout),
:mod:`.result` (frozen results, ``study.json``). Optuna is imported lazily inside
functions, so importing this package stays light.
"""
