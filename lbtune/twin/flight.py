"""One request in flight in the twin, and the record it leaves (as the live client writes it).

The record's fields follow :mod:`lbtune.loadgen.client`: a streamed request's
``chunk_times`` are the arrivals of its content chunks (one per token, each at the end of
the engine step that produced it, plus the way back to the client), ``first_token_at`` the
first of them; a non-streamed one arrives whole (``first_token_at`` = ``ended_at``, one
chunk). ``prompt_tokens`` and ``output_tokens`` are the server's ``usage`` when the
response completed, else what the client knew. Outcomes as :data:`lbtune.records.requests.
OUTCOMES`: ``ok``, ``http_error`` (the replica or the balancer answered an error),
``timeout`` (the client's request timeout), ``cancelled`` (still running when the run ended).
"""

from __future__ import annotations

import json

from lbtune.records.requests import Outcome, RequestRecord
from lbtune.sim.textgen import ApiError
from lbtune.twin.requests import TwinRequest

__all__ = ["Flight", "error_text", "record_of"]

WORKER = "twin"
"""The ``worker`` of every twin record."""


class Flight:
    """A request from its send to its end."""

    __slots__ = (
        "admitted",
        "admitted_at",
        "arrived",
        "arrived_at",
        "chunks",
        "eid",
        "ended",
        "headers_at",
        "last_token_at",
        "output_tokens",
        "queued",
        "replica",
        "req",
        "scheduled_at",
        "sent_at",
        "user",
    )

    def __init__(
        self, req: TwinRequest, sent_at: float, user: int | None, scheduled_at: float | None
    ) -> None:
        self.req = req
        self.sent_at = sent_at
        self.user = user
        self.scheduled_at = scheduled_at
        self.replica: str | None = None
        """The replica it was forwarded to (``None`` while at the balancer)."""
        self.arrived = False
        self.arrived_at = 0.0
        self.admitted = False
        self.admitted_at = 0.0
        self.eid = ""
        self.queued = False
        self.headers_at: float | None = None
        self.chunks: list[float] = []
        self.output_tokens = 0
        self.last_token_at = 0.0
        self.ended = False


def error_text(err: ApiError) -> str:
    """The client's ``error`` for an error response (``HTTP <status>: <body>``)."""
    return f"HTTP {err.status}: {json.dumps(err.body(), separators=(',', ':'))}"


def record_of(
    fl: Flight,
    outcome: Outcome,
    ended_at: float,
    replica: str | None = None,
    answer: ApiError | str | None = None,
) -> RequestRecord:
    """The record ``fl`` leaves, ending at ``ended_at`` with ``outcome``; ``answer`` is the
    error response (an :class:`ApiError`) or the client's own error text."""
    status = 200 if outcome == "ok" else answer.status if isinstance(answer, ApiError) else None
    error = error_text(answer) if isinstance(answer, ApiError) else answer
    spec = fl.req.spec
    ok = outcome == "ok"
    if spec.stream:
        chunks = tuple(fl.chunks)
        out_tokens: int | None = fl.output_tokens if ok else len(chunks)
    else:
        chunks = (ended_at,) if ok else ()
        out_tokens = fl.output_tokens if ok else None
    return RequestRecord(
        request_id=f"{WORKER}-{spec.index}",
        index=spec.index,
        model=spec.model,
        api=spec.api,
        stream=spec.stream,
        sent_at=fl.sent_at,
        ended_at=ended_at,
        outcome=outcome,
        status_code=status,
        scheduled_at=fl.scheduled_at,
        headers_at=fl.headers_at if spec.stream or not ok else ended_at,
        first_token_at=chunks[0] if chunks else None,
        chunk_times=chunks,
        prompt_tokens=fl.req.prompt_tokens if ok else spec.prompt_tokens,
        output_tokens=out_tokens,
        replica=replica,
        error=error,
        priority=spec.priority,
        prefix_group=spec.prefix_group,
        session_id=spec.session_id,
        worker=WORKER,
        timing="kernel",
        first_token_bound_s=0.0 if spec.stream else None,
        send_bound_s=0.0 if spec.stream else None,
    )
