"""One HTTP exchange on a connection: send a request, read its response into a
:class:`RequestState`, stamping every content event with its arrival time.

Reads come from a :data:`~lbtune.loadgen.kerneltime.Reader` (kernel stamps, or the
loop's ``time.time()``); the bytes are taken apart by :mod:`lbtune.loadgen.wire`.
A read that returns the first content event together with later bytes only bounds
its arrival (the kernel keeps one time per read): until the first content event,
kernel-stamped streams are read by peeking (:class:`~lbtune.loadgen.kerneltime.Peek`),
and ``RequestState.first_bound`` says how wide the remaining uncertainty is.
"""

from __future__ import annotations

from time import time
from typing import Any

from lbtune.loadgen.kerneltime import RECV, Peek, Reader, kernel_reader, loop_reader
from lbtune.loadgen.wire import (
    ChunkedDecoder,
    ProtocolError,
    ResponseHead,
    SseScanner,
    parse_head,
    parse_json_body,
)
from lbtune.records.requests import Timing

__all__ = ["Closed", "RequestState", "exchange", "read_body", "read_stream"]

_MAX_HEAD = 65536


class Closed(Exception):
    """The peer closed (or reset) the connection; ``got_bytes`` says if anything came."""

    def __init__(self, got_bytes: bool) -> None:
        super().__init__("connection closed by peer")
        self.got_bytes = got_bytes


class RequestState:
    """What one request has gathered so far (filled in by :func:`exchange`)."""

    __slots__ = (
        "ended_at",
        "error",
        "error_body",
        "first_bound",
        "got_bytes",
        "headers_at",
        "lower",
        "replica",
        "scanner",
        "sent_at",
        "status",
        "stream",
        "times",
        "timing",
        "usage_in",
        "usage_out",
    )

    def __init__(self) -> None:
        self.sent_at = 0.0
        self.headers_at: float | None = None
        self.ended_at: float | None = None
        self.got_bytes = False
        self.status: int | None = None
        self.stream = True
        self.timing: Timing = "loop"
        self.lower = 0.0
        self.first_bound: float | None = None
        self.replica: str | None = None
        self.times: list[float] = []
        self.scanner: SseScanner | None = None
        self.error: str | None = None
        self.error_body = ""
        self.usage_in: int | None = None
        self.usage_out: int | None = None


def exchange(sock: Any, req: bytes, st: RequestState, replica_header: str) -> bool:
    """Send ``req`` and read the whole response into ``st``; True = reusable.

    ``replica_header`` (lower case) names the header whose value is ``st.replica``.
    """
    read = kernel_reader(sock) if st.timing == "kernel" else loop_reader(sock)
    sock.sendall(req)
    buf = b""
    lower = st.sent_at
    while True:
        data, t = read()
        if not data:
            st.ended_at = t
            raise Closed(got_bytes=bool(buf))
        st.got_bytes = True
        buf += data
        i = buf.find(b"\r\n\r\n")
        if i >= 0:
            break
        if len(buf) > _MAX_HEAD:
            raise ProtocolError("response head larger than 64 KiB")
        if len(data) < RECV:  # the queue was drained: later bytes arrived after t
            lower = t
    st.headers_at = t
    st.lower = lower
    head = parse_head(buf[:i])
    st.status = head.status
    st.replica = head.headers.get(replica_header)
    rest = buf[i + 4 :]
    ok_status = 200 <= head.status < 300
    if not ok_status or not st.stream:
        body, st.ended_at = read_body(read, head, rest, t)
        if ok_status:
            n, st.usage_out, st.usage_in = parse_json_body(body)
            if n:
                st.times.append(st.ended_at)
        else:
            st.error_body = body[:160].decode("utf-8", "replace")
        return head.keep_alive
    peek = Peek(sock) if st.timing == "kernel" else None
    return read_stream(read, head, rest, st, peek)


def read_stream(
    read: Reader, head: ResponseHead, rest: bytes, st: RequestState, peek: Peek | None = None
) -> bool:
    """Read an SSE body, stamping content chunks; True = connection reusable.

    Until the first content event, reads are peeks (``peek``, kernel stamps only), so
    that when the first event shares a read with later bytes its own segment's stamp
    can still be had; each read's lower time bound (the previous read's stamp, once
    that read drained the socket) is kept: a stamp that is not exact lies in
    (lower, stamp], and ``st.first_bound`` says how wide that is.
    """
    sc = st.scanner = SseScanner()
    times = st.times
    t = st.headers_at or time()
    lower = st.lower
    dec = ChunkedDecoder() if head.chunked else None
    remaining = head.content_length
    data = rest
    peeked = False
    while True:
        if data:
            payload = dec.feed(data) if dec is not None else data
            if payload:
                if times:
                    k = sc.feed(payload)
                    if k:
                        if k == 1:
                            times.append(t)
                        else:
                            times.extend([t] * k)
                else:
                    _first_events(st, sc, payload, data, t, lower, dec, peek if peeked else None)
            if peeked:
                assert peek is not None
                peek.consume(len(data))
                peeked = False
            if dec is not None:
                if dec.done:
                    st.ended_at = t
                    return head.keep_alive
            elif remaining is not None:
                remaining -= len(data)
                if remaining <= 0:
                    st.ended_at = t
                    return head.keep_alive
            if len(data) < RECV:
                lower = t
        if peek is not None and not times:
            data, t = peek.peek(RECV)
            peeked = True
        else:
            data, t = read()
        if not data:
            st.ended_at = t
            if sc.done or (remaining is not None and remaining <= 0):
                return False
            raise Closed(got_bytes=True)


def _first_events(
    st: RequestState,
    sc: SseScanner,
    payload: bytes,
    data: bytes,
    t: float,
    lower: float,
    dec: ChunkedDecoder | None,
    peek: Peek | None,
) -> None:
    """Stamp the events of ``payload`` while no content event has come yet.

    ``data`` is the read's raw bytes, stamped ``t`` and no earlier than ``lower``;
    ``peek`` is given when they are still queued (peeked), to find the first event's
    own arrival where later bytes shared its read.
    """
    k, alone = sc.feed_first(payload)
    if not k:
        return
    t1, exact = t, alone and (dec is None or dec.between_chunks)
    if peek is not None and not exact:
        t1, exact = peek.first_event_arrival(data, t)
    st.times.append(t1)
    if k > 1:
        st.times.extend([t] * (k - 1))
    if st.timing == "kernel":
        st.first_bound = 0.0 if exact else max(0.0, t1 - lower)


def read_body(read: Reader, head: ResponseHead, rest: bytes, t: float) -> tuple[bytes, float]:
    """Read a whole (non-streamed) body: (body, arrival of its last byte)."""
    if head.chunked:
        dec = ChunkedDecoder()
        parts = [dec.feed(rest)] if rest else []
        while not dec.done:
            data, t = read()
            if not data:
                raise Closed(got_bytes=True)
            parts.append(dec.feed(data))
        return b"".join(parts), t
    if head.content_length is not None:
        parts = [rest]
        have = len(rest)
        while have < head.content_length:
            data, t = read()
            if not data:
                raise Closed(got_bytes=True)
            parts.append(data)
            have += len(data)
        return b"".join(parts), t
    parts = [rest]
    while True:
        data, t = read()
        if not data:
            return b"".join(parts), t
        parts.append(data)
