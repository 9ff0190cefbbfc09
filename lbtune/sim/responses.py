"""One admitted request's response, written as the GPU loop produces its tokens.

:class:`Stream` is the progress the GPU loop (:mod:`lbtune.sim.server`) shares with the
request's handler; :func:`stream_response` writes it as vLLM's SSE (a chat role chunk, one
chunk per token, each its own write, the finish and usage chunks, ``[DONE]``) and
:func:`whole_response` as one JSON body. Both stamp the request's ground truth
(``t_headers``, ``t_first_token``, ``t_last``) and mark a client that went away (499).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from lbtune.sim.textgen import (
    ParsedRequest,
    chunk_frame,
    final_chunk,
    role_chunk,
    usage_chunk,
    whole_body,
)


class Stream:
    """Progress of one admitted request, shared by the GPU loop and its handler."""

    __slots__ = (
        "arrival",
        "done",
        "event",
        "last_token_at",
        "model",
        "queued_at",
        "ready",
        "words",
    )

    def __init__(self, model: str, words: list[str], arrival: float) -> None:
        self.model = model
        self.words = words  # the text of every token the request will produce
        self.arrival = arrival
        self.queued_at = time.monotonic()  # engine arrival; < 0 once scheduled
        self.ready = 0  # tokens produced so far
        self.done = False
        self.last_token_at = 0.0
        self.event = asyncio.Event()


async def stream_response(
    request: web.Request,
    p: ParsedRequest,
    st: Stream,
    rid: str,
    headers: dict[str, str],
    gt: dict[str, Any],
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    gt.update(status=200, t_headers=time.time())
    try:
        await _send_stream(resp, p, st, rid, gt)
    except ConnectionError:  # aiohttp ends a response whose client went away quietly
        gt.update(status=499, error="client disconnected")
    return resp


async def _send_stream(
    resp: web.StreamResponse, p: ParsedRequest, st: Stream, rid: str, gt: dict[str, Any]
) -> None:
    chat = p.api == "chat"
    head, tail = chunk_frame(p, rid)
    words = st.words
    sent = 0
    while True:
        await st.event.wait()
        st.event.clear()
        while sent < st.ready:
            if sent == 0 and chat:
                await resp.write(role_chunk(p, rid))
            await resp.write(head + words[sent].encode() + tail)
            sent += 1
            if sent == 1:
                gt["t_first_token"] = time.time()
        if st.done and sent >= st.ready:
            break
    await resp.write(final_chunk(p, rid, p.finish_reason))
    if p.include_usage:
        await resp.write(usage_chunk(p, rid, sent))
    await resp.write(b"data: [DONE]\n\n")
    gt["t_last"] = time.time()
    await resp.write_eof()


async def whole_response(
    request: web.Request,
    p: ParsedRequest,
    st: Stream,
    rid: str,
    headers: dict[str, str],
    gt: dict[str, Any],
) -> web.StreamResponse:
    while not st.done:
        await st.event.wait()
        st.event.clear()
    text = "".join(st.words[: st.ready])
    body = whole_body(p, rid, text, p.finish_reason)
    resp = web.json_response(body, headers=headers)
    try:
        await resp.prepare(request)
        await resp.write_eof()
    except ConnectionError:
        gt.update(status=499, error="client disconnected")
        return resp
    t = time.time()
    gt.update(status=200, t_headers=t, t_first_token=t, t_last=t)
    return resp
