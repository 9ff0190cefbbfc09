"""The ``source:`` block of a scenario: replay a trace file instead of synthesizing.

::

    source: {trace: traces/azure.csv, format: azure, speedup: 4, start: 600, limit: 5000}

Bounds: ``speedup`` in (0, 1000] (4 = four times faster than recorded); ``start`` 0..10¹⁰
seconds of trace time after the trace's first request (the window's beginning);
``limit`` 1..10 000 000 requests; ``rate_scale`` in (0, 1] (keep that fraction of the
requests, picked by the seed: a thinned trace); ``block_tokens`` 1..65 536 (tokens per
Mooncake hash block). ``sha256`` is filled in when a run is planned, so every generator
process replays the same bytes.

The agentic formats (``weka``, ``otel``, ``copilot``: :data:`SESSION_FORMATS`) hold agent
sessions, not requests: they replay as causal sessions (:mod:`.sessions`), and ``start``,
``limit`` and ``rate_scale`` then count sessions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lbtune.scenario.limits import MAX_TRACE_ROWS, MAX_TRACE_START_S
from lbtune.scenario.traces.sessiongraph import SESSION_FORMATS

TraceFormat = Literal[
    "azure", "mooncake", "burstgpt", "sharegpt", "lbtune", "weka", "otel", "copilot"
]
FORMATS: tuple[str, ...] = ("azure", "mooncake", "burstgpt", "sharegpt", "lbtune", *SESSION_FORMATS)
TIMED: frozenset[str] = frozenset({"azure", "mooncake", "burstgpt", "lbtune", *SESSION_FORMATS})
"""Formats with arrival times (ShareGPT has none: the scenario's ``load`` times it); an
agentic trace's are its sessions' starts."""


class TraceSource(BaseModel):
    """Replay ``trace`` (a file in ``format``) instead of the synthetic distributions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace: str = Field(min_length=1, description="Trace file (relative: to the scenario file).")
    format: TraceFormat
    speedup: float = Field(default=1.0, gt=0, le=1000, description="Replay K times faster.")
    start: float = Field(
        default=0.0, ge=0, le=MAX_TRACE_START_S, description="Window start, trace seconds."
    )
    limit: int | None = Field(
        default=None, ge=1, le=MAX_TRACE_ROWS, description="At most N requests (sessions)."
    )
    rate_scale: float = Field(default=1.0, gt=0, le=1, description="Keep this fraction (seeded).")
    block_tokens: int = Field(default=512, ge=1, le=65_536, description="Mooncake block size.")
    sha256: str | None = Field(default=None, description="Pinned when a run is planned.")

    @property
    def timed(self) -> bool:
        """Whether the trace carries its own arrival times."""
        return self.format in TIMED

    @property
    def sessions(self) -> bool:
        """Whether the trace holds agent sessions (replayed causally, :mod:`.sessions`)."""
        return self.format in SESSION_FORMATS
