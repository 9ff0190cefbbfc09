"""Per-request measurement records: the exact samples every figure is computed from.

Times are wall-clock seconds (``time.time()`` on the generator host, the same
clock the simulator's ground truth uses). Definitions (see docs/metrics.md):

* TTFT: ``first_token_at - sent_at`` (first chunk with non-empty content), for
  streamed requests; a non-streamed response has no TTFT (its body arrives whole).
* ITL: gaps between consecutive content chunks.
* TPOT: ``(ended_at - first_token_at) / (output_tokens - 1)``.
* In open loop, latencies are also reported from ``scheduled_at`` so that a
  generator that fell behind cannot hide it (no coordinated omission).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal, NamedTuple

Timing = Literal["kernel", "loop"]
"""Where a record's response time stamps come from: ``kernel`` — the arrival time of the
bytes (``SO_TIMESTAMPNS``, plain TCP); ``loop`` — ``time.time()`` when the event loop got
to them (TLS, or no kernel stamps, or a read the kernel left unstamped), so event-loop lag
may be in them."""

Outcome = Literal["ok", "http_error", "broken_stream", "timeout", "connect_error", "cancelled"]
OUTCOMES: tuple[Outcome, ...] = (
    "ok",
    "http_error",
    "broken_stream",
    "timeout",
    "connect_error",
    "cancelled",
)
"""Every request sent lands in exactly one. ``cancelled``: still running when the test
ended (cut off by lbtune, not failed by the server): it is neither a success nor an
error, and it is left out of the error rate's numerator and denominator."""
ERROR_OUTCOMES: frozenset[Outcome] = frozenset(
    {"http_error", "broken_stream", "timeout", "connect_error"}
)


class OpenRequest(NamedTuple):
    """A request sent and not yet ended, as a generator saw it at a snapshot.

    ``sent_at`` is the same clock as :attr:`RequestRecord.sent_at`; ``ttft`` is seconds
    from send to the first content chunk if it has arrived, else ``None``.
    """

    sent_at: float
    ttft: float | None
    stream: bool


@dataclass(frozen=True, slots=True)
class RequestRecord:
    request_id: str
    index: int
    model: str
    api: str
    stream: bool
    sent_at: float
    ended_at: float
    outcome: Outcome
    status_code: int | None = None
    scheduled_at: float | None = None
    """Open loop: when the request was due; closed loop: ``None``."""
    headers_at: float | None = None
    first_token_at: float | None = None
    chunk_times: tuple[float, ...] = field(default_factory=tuple)
    """Arrival time of every content chunk (the first one included)."""
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    replica: str | None = None
    error: str | None = None
    priority: int | None = None
    prefix_group: int | None = None
    session_id: int | None = None
    worker: str = "local"
    timing: Timing = "loop"
    first_token_bound_s: float | None = None
    """The TTFT (``first_token_at - sent_at``) is at most this much more than the true
    time from the request's write to the first content event's arrival: the first
    event's stamp (0 when the kernel stamped it and no later byte shared its read, else
    the interval since the last stamped read) plus the write's own duration. ``None``
    when unknown (a ``loop``-timed client: TLS or kernel stamps off; or no content)."""
    send_bound_s: float | None = None
    """The write's own duration, the part of ``first_token_bound_s`` that is not the
    first-token stamp's: the request reached the wire in ``[sent_at, sent_at +
    send_bound_s]``. ``None`` where ``first_token_bound_s`` is."""

    @property
    def read_bound_s(self) -> float | None:
        """The first-token stamp's own uncertainty (``first_token_bound_s`` less the
        write's part): 0 when the first token was read on its own and kernel-stamped."""
        if self.first_token_bound_s is None:
            return None
        return max(0.0, self.first_token_bound_s - (self.send_bound_s or 0.0))

    @property
    def ttft(self) -> float | None:
        """Streamed requests only: a non-streamed body has no first token to time."""
        if not self.stream or self.first_token_at is None:
            return None
        return self.first_token_at - self.sent_at

    @property
    def e2e(self) -> float:
        return self.ended_at - self.sent_at

    @property
    def lateness(self) -> float | None:
        return None if self.scheduled_at is None else self.sent_at - self.scheduled_at

    @property
    def itls(self) -> tuple[float, ...]:
        c = self.chunk_times
        return tuple(b - a for a, b in pairwise(c))

    @property
    def tpot(self) -> float | None:
        first = self.first_token_at
        if not self.stream or first is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.ended_at - first) / (self.output_tokens - 1)
