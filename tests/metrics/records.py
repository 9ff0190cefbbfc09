"""Synthetic request records for the metrics and report tests."""

from __future__ import annotations

from lbtune.records.requests import Outcome, RequestRecord


def rec(
    i: int,
    *,
    sent: float,
    ttft: float | None = 0.05,
    e2e: float = 0.5,
    outcome: Outcome = "ok",
    replica: str | None = "r0",
    output_tokens: int | None = 10,
    scheduled: float | None = None,
    chunks: tuple[float, ...] | None = None,
) -> RequestRecord:
    """One record sent at ``sent``; chunk times default to first token and end."""
    first = None if ttft is None else sent + ttft
    if chunks is None:
        chunks = () if first is None else (first, sent + e2e)
    return RequestRecord(
        request_id=f"req-{i}",
        index=i,
        model="m",
        api="chat",
        stream=True,
        sent_at=sent,
        ended_at=sent + e2e,
        outcome=outcome,
        status_code=200 if outcome == "ok" else None,
        scheduled_at=scheduled,
        first_token_at=first,
        chunk_times=chunks,
        output_tokens=output_tokens,
        replica=replica,
    )
