"""The generator's records against the echo server's own ground truth (TTFT only).

:mod:`lbtune.loadgen.echo` stamps, per request, the kernel's arrival time of the
request (``t_recv``) and its clock right before and right after the first content
write (``t_first``, ``t_sent``). Over loopback the request's arrival is stamped during
the client's write and the response's during the server's, so for a record with TTFT
``m`` (from ``sent_at``) and bound ``b`` (``first_token_bound_s``):

* ``error  = |m - (t_first - t_recv)|`` — the plain per-request TTFT error (what the
  issue measures; the server's own delay between ``t_first`` and its write is in it);
* ``excess = max(0, m - (t_sent - t_recv))`` — how much ``m`` overstates even the
  server's latest possible view: the generator's own part, which must be ``<= b``;
* ``under  = max(0, (t_first - t_recv) - m)`` — how much ``m`` understates the
  server's earliest view: must be 0 (``m`` never claims less time than passed).

Used by the honesty test (``tests/loadgen/test_honesty.py``) and
``benchmarks/ttft_accuracy.py``: one definition of the comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lbtune.records import quantiles
from lbtune.records.requests import RequestRecord

__all__ = ["EPSILON_S", "Accuracy", "Truth", "compare"]

Truth = Mapping[str, Mapping[str, float | None]]
"""The echo server's ``GET /debug/requests``: request id -> its stamps."""
EPSILON_S = 50e-6
"""Rounding of ``time.time()`` floats and loopback's own path: below this, no violation."""


@dataclass(frozen=True, slots=True)
class Accuracy:
    """Per-request TTFT error of one run against the ground truth (seconds)."""

    n: int
    error_p50_s: float | None
    error_p99_s: float | None
    excess_p99_s: float | None
    bound_p99_s: float | None
    """P99 of the records' own bounds (``first_token_bound_s``)."""
    server_write_p99_s: float | None
    """P99 of ``t_sent - t_first``: the server's own uncertainty, outside lbtune."""
    violations: int
    """Records whose ``excess > bound`` or ``under > 0`` (beyond :data:`EPSILON_S`)."""
    unbounded: int
    """Records with no bound (loop-timed client)."""
    send_p99_s: float | None = None
    """P99 of ``t_recv - sent_at``: from the send stamp to the request's arrival (the
    send side of the excess: a preempted process, a slow write)."""
    late_p99_s: float | None = None
    """P99 of ``max(0, first_token_at - t_sent)``: how much later than the server's write
    the first token was stamped (the receive side: merged, late or unstamped reads)."""
    violating: tuple[str, ...] = ()
    """The first few violations, one line each with every stamp (for the failure's message)."""


def _p(values: Sequence[float], q: float) -> float | None:
    return quantiles.percentile(values, q) if values else None


def compare(records: Sequence[RequestRecord], truth: Truth, since: float = 0.0) -> Accuracy:
    """:class:`Accuracy` of the streamed ok records sent at or after ``since``."""
    error: list[float] = []
    excess: list[float] = []
    bounds: list[float] = []
    server: list[float] = []
    send: list[float] = []
    late: list[float] = []
    violations = unbounded = 0
    violating: list[str] = []
    for r in records:
        g = truth.get(r.request_id)
        if g is None or r.first_token_at is None or r.outcome != "ok" or r.sent_at < since:
            continue
        t_recv, t_first, t_sent = g.get("t_recv"), g.get("t_first"), g.get("t_sent")
        if t_recv is None or t_first is None:
            continue
        m = r.first_token_at - r.sent_at
        error.append(abs(m - (t_first - t_recv)))
        over = max(0.0, m - (t_sent - t_recv)) if t_sent is not None else 0.0
        excess.append(over)
        send.append(t_recv - r.sent_at)
        if t_sent is not None:
            server.append(t_sent - t_first)
            late.append(max(0.0, r.first_token_at - t_sent))
        b = r.first_token_bound_s
        if b is None:
            unbounded += 1
        else:
            bounds.append(b)
        too_much = b is not None and over > b + EPSILON_S
        if too_much or (t_first - t_recv) - m > EPSILON_S:
            violations += 1
            if len(violating) < 3:
                violating.append(_describe(r, g))
    return Accuracy(
        n=len(error),
        error_p50_s=_p(error, 50),
        error_p99_s=_p(error, 99),
        excess_p99_s=_p(excess, 99),
        bound_p99_s=_p(bounds, 99),
        server_write_p99_s=_p(server, 99),
        violations=violations,
        unbounded=unbounded,
        send_p99_s=_p(send, 99),
        late_p99_s=_p(late, 99),
        violating=tuple(violating),
    )


def _describe(r: RequestRecord, g: Mapping[str, float | None]) -> str:
    """One violating record, its times relative to its ``sent_at`` (ms)."""

    def rel(x: float | None) -> str:
        return "-" if x is None else f"{(x - r.sent_at) * 1e3:.3f}"

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1e3:.3f}"

    return (
        f"{r.request_id}: first token {rel(r.first_token_at)} bound {ms(r.first_token_bound_s)} "
        f"(send {ms(r.send_bound_s)}, read {ms(r.read_bound_s)}); server recv "
        f"{rel(g.get('t_recv'))} first {rel(g.get('t_first'))} sent {rel(g.get('t_sent'))}; "
        f"chunks {[rel(t) for t in r.chunk_times[:3]]}"
    )
