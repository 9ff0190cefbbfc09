"""Records against the echo server's truth, by hand (lbtune.loadgen.groundtruth)."""

from __future__ import annotations

import pytest

from lbtune.loadgen.groundtruth import compare
from lbtune.records.requests import RequestRecord


def rec(rid: str, sent: float, first: float, bound: float | None) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        index=0,
        model="m",
        api="chat",
        stream=True,
        sent_at=sent,
        ended_at=first + 1.0,
        outcome="ok",
        first_token_at=first,
        timing="kernel",
        first_token_bound_s=bound,
    )


TRUTH = {
    # The request arrived 1 ms after the send stamp; first write 50.0-50.5 ms after that.
    "a": {"t_recv": 100.001, "t_first": 100.051, "t_sent": 100.0515},
    "b": {"t_recv": 200.001, "t_first": 200.051, "t_sent": 200.0515},
}


def test_error_excess_and_the_records_bounds() -> None:
    # a: stamped 0.2 ms after the write ended: excess 1.2 ms, inside its 2 ms bound.
    # b: stamped 10 ms late with a bound of 5 ms: a broken bound.
    records = [rec("a", 100.0, 100.0517, 0.002), rec("b", 200.0, 200.0615, 0.005)]
    acc = compare(records, TRUTH)
    assert acc.n == 2 and acc.unbounded == 0 and acc.violations == 1
    assert acc.error_p50_s == pytest.approx((0.0017 + 0.0115) / 2)
    assert acc.excess_p99_s == pytest.approx(0.0012 + 0.99 * (0.0110 - 0.0012))
    assert acc.send_p99_s == pytest.approx(0.001)
    assert acc.late_p99_s == pytest.approx(0.0002 + 0.99 * (0.01 - 0.0002))
    # The violation is described for the failure's message: b, 61.5 ms, bound 5 ms.
    assert len(acc.violating) == 1
    assert acc.violating[0].startswith("b: first token 61.500 bound 5.000")


def test_a_ttft_shorter_than_the_servers_is_a_violation() -> None:
    """Stamped before the server even began its write: impossible, so a broken claim."""
    acc = compare([rec("a", 100.0, 100.040, 0.0)], TRUTH)
    assert acc.violations == 1


def test_unbounded_and_unmatched_records() -> None:
    records = [rec("a", 100.0, 100.0517, None), rec("zz", 1.0, 2.0, 0.0)]
    acc = compare(records, TRUTH, since=50.0)
    assert acc.n == 1 and acc.unbounded == 1 and acc.violations == 0
