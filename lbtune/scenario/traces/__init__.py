"""Trace files a scenario can replay (``source:``): one parser module per format.

:func:`lbtune.scenario.traces.read.read_trace` parses and validates a file row by row
(a bad row is one :class:`~lbtune.errors.ConfigError` naming file, line and column);
:mod:`.replay` turns the rows into send times and requests; :mod:`.fit` summarizes a
trace as a synthetic scenario. Agentic traces (``weka``, ``otel``, ``copilot``) parse into
session graphs (:mod:`.readsessions`), replay as causal sessions (:mod:`.sessions`) and fit
to an ``agent:`` scenario (:mod:`.fitsessions`). This package's ``__init__`` imports
nothing, so the scenario model can import :mod:`.spec` without a cycle.
"""
