"""Censored samples: hand-computed expectations for every kind of request."""

from __future__ import annotations

import dataclasses
import math

import pytest

from lbtune.metrics.censor import CensoredSamples, censored_samples
from lbtune.records.requests import RequestRecord
from tests.metrics.records import rec


def _unstreamed(r: RequestRecord) -> RequestRecord:
    return dataclasses.replace(r, stream=False, first_token_at=None, chunk_times=())


def test_each_outcome_in_the_window() -> None:
    records = [
        rec(0, sent=9.0, ttft=0.1, e2e=1.0),  # before the window: left out
        rec(1, sent=10.0, ttft=0.2, e2e=1.0),  # ok
        _unstreamed(rec(2, sent=11.0, ttft=None, e2e=2.0)),  # ok, not streamed
        rec(3, sent=12.0, ttft=0.3, e2e=5.0, outcome="cancelled"),  # first token, cut off
        rec(4, sent=13.0, ttft=None, e2e=4.0, outcome="cancelled"),  # no token, cut off
        rec(5, sent=14.0, ttft=None, e2e=0.1, outcome="http_error"),
        rec(6, sent=20.0, ttft=0.1, e2e=0.5),  # at the window's end: left out
    ]
    got = censored_samples(records, start=10.0, end=20.0)
    assert got.e2e == pytest.approx((1.0, 2.0, 5.0, 4.0))
    assert got.ttft[0] == pytest.approx(0.2)
    assert math.isnan(got.ttft[1])
    assert got.ttft[2:] == pytest.approx((0.3, 4.0))
    assert (got.sent, got.errors, got.censored) == (5, 1, 2)
    assert got.streamed_ttft == pytest.approx((0.2, 0.3, 4.0))


def test_open_requests_at_now_are_lower_bounds() -> None:
    records = [rec(1, sent=10.0, ttft=0.2, e2e=1.0)]
    open_requests = [
        (12.0, 0.5, True),  # first token arrived, still streaming
        (13.0, None, True),  # waiting for its first token
        (14.0, None, False),  # not streamed
        (9.0, None, True),  # sent before the window, still open: it occupies the window
        (31.0, None, True),  # sent after the window (and after now): not there
    ]
    got = censored_samples(records, start=10.0, end=30.0, now=15.0, open_requests=open_requests)
    assert got.e2e == pytest.approx((1.0, 3.0, 2.0, 1.0, 6.0))
    assert got.ttft[:3] == pytest.approx((0.2, 0.5, 2.0))
    assert math.isnan(got.ttft[3])
    assert got.ttft[4] == pytest.approx(6.0)  # from its send, no first token yet
    assert (got.sent, got.errors, got.censored, got.carried) == (5, 0, 4, 1)


def test_a_window_sees_every_request_that_occupies_it() -> None:
    """Sent in the warm-up and still running when the window opens: counted from its send;
    ended before the window opened, or sent after it closed: not counted."""
    records = [
        rec(0, sent=5.0, ttft=0.1, e2e=5.0),  # ended exactly at the start: not in flight
        rec(1, sent=6.0, ttft=0.2, e2e=8.0),  # warm-up, ends at 14: 8 s from its send
        rec(2, sent=7.0, ttft=None, e2e=30.0, outcome="cancelled"),  # parked, cut off at 37
        rec(3, sent=8.0, ttft=None, e2e=3.0, outcome="timeout"),  # warm-up, fails at 11
        rec(4, sent=12.0, ttft=0.1, e2e=1.0),  # sent in the window
        rec(5, sent=20.0, ttft=0.1, e2e=1.0),  # at the window's end: not in it
    ]
    got = censored_samples(records, start=10.0, end=20.0)
    assert got.e2e == pytest.approx((8.0, 30.0, 1.0))
    assert got.ttft == pytest.approx((0.2, 30.0, 0.1))
    assert (got.sent, got.errors, got.censored, got.carried) == (4, 1, 1, 3)
    assert got.finished == 2 and got.error_rate == pytest.approx(1 / 3)
    # At a checkpoint (now = 12): the warm-up request still open counts at 6 s.
    mid = censored_samples(records, start=10.0, end=20.0, now=12.5)
    assert mid.e2e == pytest.approx((6.5, 5.5, 0.5))
    assert (mid.sent, mid.errors, mid.censored) == (4, 1, 3)


def test_records_that_end_after_now_are_open_then() -> None:
    """The final records seen as of ``now``: what had not ended yet is censored at ``now``."""
    records = [
        rec(1, sent=10.0, ttft=0.2, e2e=1.0),  # ended at 11: measured
        rec(2, sent=12.0, ttft=1.0, e2e=8.0),  # first token at 13, ends at 20
        rec(3, sent=13.0, ttft=4.0, e2e=6.0),  # first token at 17, after now
        rec(4, sent=14.5, ttft=0.1, e2e=0.2, outcome="timeout"),  # ends at 14.7: an error
        rec(5, sent=16.0, ttft=0.1, e2e=0.2),  # sent after now: does not exist yet
    ]
    got = censored_samples(records, start=10.0, end=30.0, now=15.0)
    assert got.e2e == pytest.approx((1.0, 3.0, 2.0))
    assert got.ttft == pytest.approx((0.2, 1.0, 2.0))
    assert (got.sent, got.errors, got.censored) == (4, 1, 2)


def test_open_requests_need_now() -> None:
    with pytest.raises(ValueError, match="now"):
        censored_samples([], start=0.0, end=1.0, open_requests=[(0.5, None, True)])


def test_empty() -> None:
    assert censored_samples([], start=0.0, end=1.0) == CensoredSamples((), (), 0, 0, 0)


def test_tpot_is_paired_with_each_sample_and_only_ended_requests_have_one() -> None:
    """An ended request's TPOT, in the same position as its E2E; NaN for one with a single
    token, one cut off and one still open (their figures are lower bounds)."""
    records = [
        rec(0, sent=10.0, ttft=0.2, e2e=2.2, output_tokens=11),  # (2.2 - 0.2) / 10
        rec(1, sent=11.0, ttft=0.2, e2e=1.0, output_tokens=1),  # one token: no TPOT
        rec(2, sent=12.0, ttft=0.3, e2e=5.0, outcome="cancelled"),
        rec(3, sent=13.0, ttft=0.3, e2e=9.0),  # still open at 15
    ]
    got = censored_samples(records, start=10.0, end=30.0, now=15.0)
    assert len(got.tpot) == len(got.e2e) == 4
    assert got.tpot[0] == pytest.approx(0.2)
    assert all(math.isnan(t) for t in got.tpot[1:])
