"""Censoring: the latency samples of a window, every request that occupies it included.

The one rule behind every scored figure (a trial's objective, its pruning checkpoints,
confirmation's pooled runs, the twin's virtual runs); see ``docs/metrics.md``,
"Censoring". A configuration must not look better because its slowest requests have not
finished yet, nor because they were sent before the window opened.

**Who counts** — every request that **occupies** the window ``[start, end)``: sent before
its end and not ended before its start, whatever its send time. A request sent during the
warm-up and still running when the window opens counts (``carried``): in a closed loop
that is a user stuck on a slow replica, which a rule over requests *sent* in the window
never sees (the user sends nothing while it is stuck). Requests sent after ``now`` do not
exist yet.

**What it counts** — its latency from its send, as known at ``now`` (a checkpoint) or
from its record (the final figures):

* ``ok`` — its measured TTFT and E2E;
* ``cancelled`` (still running when the test ended and cut off) — what had elapsed by
  then: E2E ``ended_at - sent_at``; TTFT its TTFT if the first token had arrived, else
  the elapsed time;
* still **open** at ``now`` (an ``open_requests`` entry, or a record that ends after
  ``now``) — E2E ``now - sent_at``; TTFT its TTFT if known, else ``now - sent_at``;
* an error (``http_error``, ``broken_stream``, ``timeout``, ``connect_error``) — no
  latency sample; counted in ``errors``. What is *scored* (:meth:`CensoredSamples.
  scored`) counts each error as a request never answered: open until the window closes
  (``end - sent_at``, as of ``now`` at a checkpoint) and at least as slow as the window's
  slowest, so that a configuration cannot better its tail by refusing requests (a 429 in
  1 ms is not a fast answer).

A request that was not streamed has no TTFT: its ``ttft`` entry is NaN, so that the
tuples stay paired per request (the bootstrap resamples requests). ``tpot`` is paired the
same way: an ended request's :attr:`~lbtune.records.requests.RequestRecord.tpot`, NaN where
it has none (not streamed, fewer than two tokens) and for a request cut off or open (its
other figures are lower bounds; a TPOT of part of a stream is not one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from lbtune.records.requests import ERROR_OUTCOMES, RequestRecord

__all__ = ["CensoredSamples", "OpenRequestLike", "censored_samples", "occupies"]

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
    """Requests that occupied the window (open ones included; errors too)."""
    errors: int
    censored: int
    """Samples that are lower bounds (cancelled or still open)."""
    carried: int = 0
    """Of ``sent``, requests sent before the window opened (still running at its start)."""
    tpot: tuple[float, ...] = ()
    """Paired with ``e2e`` per request (NaN where none); empty when not collected."""

    @property
    def streamed_ttft(self) -> tuple[float, ...]:
        """The TTFT samples without the NaNs of non-streamed requests."""
        return tuple(t for t in self.ttft if not math.isnan(t))

    failed_open_s: tuple[float, ...] = ()
    """Per error, from its send to the window's close (or ``now``): how long it stayed
    unanswered within the window."""

    def scored(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """``(ttft, e2e)`` as scored: every sample, then one pair per error, each at the
        longer of its :attr:`failed_open_s` and the window's slowest (NaN TTFT when
        nothing was streamed); the samples alone when there is no error or no sample."""
        if not self.errors or not self.e2e:
            return self.ttft, self.e2e
        streamed = self.streamed_ttft
        worst_ttft = max(streamed) if streamed else math.nan
        worst_e2e = max(self.e2e)
        opens = self.failed_open_s or (0.0,) * self.errors
        return (
            self.ttft + tuple(math.nan if not streamed else max(worst_ttft, o) for o in opens),
            self.e2e + tuple(max(worst_e2e, o) for o in opens),
        )

    @property
    def finished(self) -> int:
        """Samples of requests that ended (not lower bounds)."""
        return len(self.e2e) - self.censored

    @property
    def error_rate(self) -> float:
        """Errors over the requests judged: the ended ones (a cut-off or open request has
        no verdict either way); 0 when none ended."""
        judged = self.finished + self.errors
        return self.errors / judged if judged else 0.0


def occupies(sent_at: float, ended_at: float | None, start: float, end: float) -> bool:
    """Whether a request sent at ``sent_at`` (ended at ``ended_at``, None while open) was
    in flight at some moment of ``[start, end)``: the window's membership rule."""
    if sent_at >= end:
        return False
    return sent_at >= start or ended_at is None or ended_at > start


def censored_samples(
    records: Iterable[RequestRecord],
    *,
    start: float,
    end: float,
    now: float | None = None,
    open_requests: Iterable[OpenRequestLike] = (),
) -> CensoredSamples:
    """The censored samples of the requests that occupy ``[start, end)`` (as of ``now``)."""
    nan = math.nan
    ttft: list[float] = []
    e2e: list[float] = []
    tpot: list[float] = []
    sent = errors = censored = carried = 0
    failed_open: list[float] = []
    close = end if now is None else min(end, now)

    def add(t: float | None, e: float, stream: bool, *, lower_bound: bool) -> None:
        nonlocal censored
        ttft.append((e if t is None else t) if stream else nan)
        e2e.append(e)
        tpot.append(nan)
        censored += lower_bound

    for r in records:
        is_open = now is not None and r.ended_at > now
        if (now is not None and r.sent_at >= now) or not occupies(
            r.sent_at, None if is_open else r.ended_at, start, end
        ):
            continue
        sent += 1
        carried += r.sent_at < start
        if is_open:
            assert now is not None
            first = r.ttft if r.ttft is not None and r.sent_at + r.ttft <= now else None
            add(first, now - r.sent_at, r.stream, lower_bound=True)
        elif r.outcome == "ok":
            ttft.append(nan if r.ttft is None else r.ttft)
            e2e.append(r.e2e)
            per_token = r.tpot
            tpot.append(nan if per_token is None else per_token)
        elif r.outcome == "cancelled":
            add(r.ttft, r.e2e, r.stream, lower_bound=True)
        elif r.outcome in ERROR_OUTCOMES:
            errors += 1
            failed_open.append(max(0.0, close - r.sent_at))
    pending = list(open_requests)
    if pending and now is None:
        raise ValueError("open requests need the time they were open at (now)")
    for sent_at, first_ttft, stream in pending:
        assert now is not None
        if sent_at <= now and now > start and occupies(sent_at, None, start, end):
            sent += 1
            carried += sent_at < start
            add(first_ttft, now - sent_at, stream, lower_bound=True)
    return CensoredSamples(
        ttft=tuple(ttft),
        e2e=tuple(e2e),
        sent=sent,
        errors=errors,
        censored=censored,
        carried=carried,
        tpot=tuple(tpot),
        failed_open_s=tuple(failed_open),
    )
