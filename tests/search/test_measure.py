"""Scoring a trial from its records: cut-off requests are censored, not forgiven."""

from __future__ import annotations

from lbtune.loadgen.records import RequestRecord
from lbtune.search.measure import censored, partial_figures


def rec(
    i: int, outcome: str, sent: float, end: float, first: float | None, stream: bool = True
) -> RequestRecord:
    return RequestRecord(
        request_id=str(i), index=i, model="m", api="chat", stream=stream,
        sent_at=sent, ended_at=end, outcome=outcome, first_token_at=first,  # type: ignore[arg-type]
    )  # fmt: skip


def test_cancelled_requests_enter_the_score_at_their_elapsed_time() -> None:
    records = [
        rec(0, "ok", 0.0, 1.0, 0.1),
        rec(1, "cancelled", 0.0, 9.0, None),  # still waiting for its first token at the end
        rec(2, "cancelled", 1.0, 9.0, 1.5),
        rec(3, "http_error", 2.0, 2.1, None),
        rec(4, "ok", 2.0, 3.0, 3.0, stream=False),  # a whole body: no first token to time
        rec(5, "cancelled", 2.0, 9.0, None, stream=False),
    ]
    assert censored(records) == [(0.1, 1.0), (9.0, 9.0), (0.5, 8.0), (None, 1.0), (None, 7.0)]


def test_partial_figures_count_only_real_errors() -> None:
    records = [
        rec(0, "ok", 0.0, 1.0, 0.1),
        rec(1, "ok", 0.5, 1.5, 0.6),
        rec(2, "cancelled", 1.0, 9.0, 1.5),
        rec(3, "timeout", 1.0, 9.0, None),
    ]
    fig = partial_figures(records, 0.0, 5.0)
    assert fig is not None
    assert fig.error_rate == 1 / 3  # cancelled: neither success nor error
    assert fig.completed == 2
