"""Every bound of a scenario, in one place: what a number in a scenario or a trace may be.

A number becomes work (seconds of load, requests planned, tokens synthesized, bytes held),
so each field of the scenario model (:mod:`.models`, :mod:`.shapes`, :mod:`.distributions`,
:mod:`.traces.spec`) and each trace row (:mod:`.traces.rows`) is checked against these at
load time; what a whole scenario implies (the run's length, the longest prompt with its
prefix and session history, the memory of its caches) is checked by
``Scenario``'s validator, and what a trace implies by its replay, before anything starts.
The table in ``docs/scenarios.md`` lists them (a test keeps it in step with the models).
"""

from __future__ import annotations

MAX_DURATION_S = 7 * 24 * 3600.0
"""Longest run a scenario (or ``--duration``) may ask for: a week."""
MAX_USERS = 50_000
"""Most closed-loop users (one generator process holds some thousands)."""
MAX_RATE = 10_000.0
"""Highest open-loop arrival rate, req/s."""
MAX_ARRIVALS = 4_000_000
"""Most requests an open-loop plan may schedule (each generator process holds the plan:
about 100 MB per million arrivals): e.g. 1000 req/s for an hour."""
MAX_TOKENS = 1_048_576
"""Longest length any token field may give (a distribution's clip or value, a prefix, a
trace row's prompt or output)."""
MAX_PROMPT_TOKENS = MAX_TOKENS
"""Longest prompt a request may carry: its shared prefix, the session's history and the
new message (each distribution's 1 - 1e-9 quantile): longer prompts than any model's
context would only exhaust the generator's memory."""
MAX_CACHED_BYTES = 1024 * 1024 * 1024
"""Most bytes of prompt text the workload's caches may hold in one generator process (its
shared system prompts and its sessions, at their mean lengths): 1 GiB."""
SYSTEM_PROMPT_CACHE = 1024
"""Shared system prompts a workload keeps synthesized (an LRU)."""
SESSION_CACHE = 4096
"""Sessions (every turn's text) a workload keeps synthesized (an LRU)."""
AGENT_SESSION_CACHE = 1024
"""Agent sessions (every call's reply, tool output and task text) an agent workload keeps
synthesized (an LRU): about the sessions a run has open at once."""
MAX_SUBAGENTS = 16
"""Most subagents one fan-out of an agent session may spawn."""
BYTES_PER_TOKEN = 6
"""Bytes of synthesized text per token (a word of at most 6 letters and its space)."""
MAX_WEIGHT = 1e9
"""Largest relative weight (classes, models, APIs, priorities)."""
MAX_PRIORITY = 2**31 - 1
"""Largest priority value (vLLM's priority is a 32-bit integer); the smallest is its
negative."""
MAX_SLO_S = 86_400.0
"""Longest SLO target: a day."""
MAX_SIGMA = 20.0
"""Largest sigma of a lognormal's ``ln(length)``."""
MAX_STD = 1e9
"""Largest standard deviation of a normal or lognormal length."""
MAX_CV = 20.0
"""Largest coefficient of variation of gamma arrivals (1 = Poisson)."""
MAX_TRACE_START_S = 1e10
"""Latest window start in a trace, seconds of trace time (three centuries)."""
MAX_TRACE_ROWS = 10_000_000
"""Most requests a trace file may hold."""
MAX_TRACE_TIME_S = 1e12
"""Largest timestamp a trace row may give, seconds (year 33 658; epoch seconds fit)."""
MAX_HASH_IDS = 65_536
"""Most block hashes one Mooncake row may list."""
MAX_FIT_VALUE = 1e12
"""Largest figure a fitted scenario's ``fitted.percentiles`` may record."""
MAX_FIT_REQUESTS = 10**12
"""Largest request count a fitted scenario may record."""
