"""Censoring: the latency samples of a window, unfinished requests included as lower bounds.

A configuration must not look better because its slowest requests have not finished
yet. Over the requests **sent** in ``[start, end)``:

* ``ok`` — its measured TTFT and E2E;
* ``cancelled`` (still running when the test ended and cut off) — what had elapsed by
  then: E2E ``ended_at - sent_at``; TTFT its TTFT if the first token had arrived, else
  the elapsed time;
* still **open** at ``now`` (an ``open_requests`` entry, or a record that ends after
  ``now``) — E2E ``now - sent_at``; TTFT its TTFT if known, else ``now - sent_at``;
* an error (``http_error``, ``broken_stream``, ``timeout``, ``connect_error``) — no
  latency sample; counted in ``errors``.

A request that was not streamed has no TTFT: its ``ttft`` entry is NaN, so that the
two tuples stay paired per request (the bootstrap resamples requests). Requests sent
after ``now`` do not exist yet and are left out. See ``docs/metrics.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from lbtune.records.requests import ERROR_OUTCOMES, RequestRecord

__all__ = ["CensoredSamples", "OpenRequestLike", "censored_samples"]

OpenRequestLike = tuple[float, float | None, bool]
"""``(sent_at, ttft, stream)`` of a request sent and not yet ended at ``now``
(``lbtune.records.requests.OpenRequest`` is one)."""


@dataclass(frozen=True)
class CensoredSamples:
    """Per-request latency samples (seconds) of a window; see the module docstring."""

    ttft: tuple[float, ...]
    """NaN for a request that was not streamed; paired with ``e2e`` per request."""
    e2e: tuple[float, ...]
    sent: int
    """Requests sent in the window (open ones included)."""
    errors: int
    censored: int
    """Samples that are lower bounds (cancelled or still open)."""

    @property
    def streamed_ttft(self) -> tuple[float, ...]:
        """The TTFT samples without the NaNs of non-streamed requests."""
        return tuple(t for t in self.ttft if not math.isnan(t))


def censored_samples(
    records: Iterable[RequestRecord],
    *,
    start: float,
    end: float,
    now: float | None = None,
    open_requests: Iterable[OpenRequestLike] = (),
) -> CensoredSamples:
    """The censored samples of the requests sent in ``[start, end)`` (as of ``now``)."""
    nan = math.nan
    ttft: list[float] = []
    e2e: list[float] = []
    sent = errors = censored = 0

    def add(t: float | None, e: float, stream: bool, *, lower_bound: bool) -> None:
        nonlocal censored
        ttft.append((e if t is None else t) if stream else nan)
        e2e.append(e)
        censored += lower_bound

    for r in records:
        if not start <= r.sent_at < end or (now is not None and r.sent_at >= now):
            continue
        sent += 1
        if now is not None and r.ended_at > now:
            first = r.ttft if r.ttft is not None and r.sent_at + r.ttft <= now else None
            add(first, now - r.sent_at, r.stream, lower_bound=True)
        elif r.outcome == "ok":
            ttft.append(nan if r.ttft is None else r.ttft)
            e2e.append(r.e2e)
        elif r.outcome == "cancelled":
            add(r.ttft, r.e2e, r.stream, lower_bound=True)
        elif r.outcome in ERROR_OUTCOMES:
            errors += 1
    pending = list(open_requests)
    if pending and now is None:
        raise ValueError("open requests need the time they were open at (now)")
    for sent_at, first_ttft, stream in pending:
        assert now is not None
        if start <= sent_at < end and sent_at <= now:
            sent += 1
            add(first_ttft, now - sent_at, stream, lower_bound=True)
    return CensoredSamples(
        ttft=tuple(ttft), e2e=tuple(e2e), sent=sent, errors=errors, censored=censored
    )
