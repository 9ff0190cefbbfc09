"""One HTTP exchange on a connection: send a request, read its response into a
:class:`RequestState`, stamping every content event with its arrival time.

Reads come from a :data:`~lbtune.loadgen.kerneltime.Reader` (kernel stamps, or the
loop's ``time.time()``); the bytes are taken apart by :mod:`lbtune.loadgen.wire`.
A read that returns the first content event together with later bytes only bounds
its arrival (the kernel keeps one time per read): until the first content event,
kernel-stamped streams are read by peeking (:class:`~lbtune.loadgen.kerneltime.Peek`),
and ``RequestState.first_bound`` says how wide the remaining uncertainty is.

The bound is an interval, never a hope: a first-token stamp is exact only when the
kernel stamped the read and nothing later shared it; otherwise the event arrived after
the last *kernel-stamped* read that drained the socket (or after the request was
written) and no later than its stamp. A read the kernel did not stamp (its time is the
loop's) never moves that lower end, and marks the request ``unstamped``. The send side
is bounded the same way: ``sent_at`` is taken right before the write (the connection is
ready by then) and ``send_bound`` is how long the write took, so the request reached the
wire inside ``[sent_at, sent_at + send_bound]``.
"""

from __future__ import annotations

from time import time
from typing import Any

from lbtune.loadgen.kerneltime import RECV, Peek, Read, Reader, kernel_reader, loop_reader
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
        "head_lower",
        "headers_at",
        "lower",
        "replica",
        "scanner",
        "send_bound",
        "sent_at",
        "stamped",
        "status",
        "stream",
        "times",
        "timing",
        "unstamped",
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
        """Response bytes not yet read arrived after this (the last stamped draining read)."""
        self.first_bound: float | None = None
        """Kernel timing: the first token arrived in ``[times[0] - first_bound, times[0]]``."""
        self.send_bound = 0.0
        """The request was written in ``[sent_at, sent_at + send_bound]``."""
        self.stamped = False
        """Whether the kernel stamped the last read."""
        self.head_lower: float | None = None
        """The head's read: ``lower`` once the bytes that came with the head are used."""
        self.unstamped = False
        """Some read with bytes carried the loop's time, not the kernel's."""
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
    st.sent_at = time()
    sock.sendall(req)
    st.send_bound = time() - st.sent_at
    buf = b""
    st.lower = st.sent_at
    while True:
        data, t, stamped = read()
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
        _note(st, data, t, stamped)
    st.headers_at = t
    st.stamped = stamped
    st.unstamped |= not stamped
    st.head_lower = t if stamped and len(data) < RECV else None
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


def _note(st: RequestState, data: bytes, t: float, stamped: bool) -> None:
    """After a read with bytes: is it stamped, and does it move the lower end?"""
    st.stamped = stamped
    if not stamped:
        st.unstamped = True
    elif len(data) < RECV:  # the queue was drained: later bytes arrived after t
        st.lower = t


def read_stream(
    read: Reader, head: ResponseHead, rest: bytes, st: RequestState, peek: Peek | None = None
) -> bool:
    """Read an SSE body, stamping content chunks; True = connection reusable.

    Until the first content event, reads are peeks (``peek``, kernel stamps only), so
    that when the first event shares a read with later bytes its own segment's stamp
    can still be had. ``rest`` came with the head (``st.headers_at``, ``st.stamped``);
    ``st.lower`` is the lower end of the next bytes' arrival (see the module's notes).
    """
    sc = st.scanner = SseScanner()
    times = st.times
    t = st.headers_at or time()
    stamped = st.stamped
    dec = ChunkedDecoder() if head.chunked else None
    remaining = head.content_length
    data = rest
    if not rest and st.head_lower is not None:  # the head came alone and drained the socket
        st.lower = st.head_lower
    peeked = fresh = False  # fresh: data is a read of its own (else rest, read with the head)
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
                    _first_events(st, payload, (data, t, stamped), dec, peek if peeked else None)
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
            if fresh:  # _note, inlined (once per read)
                if not stamped:
                    st.unstamped = True
                elif len(data) < RECV:
                    st.lower = t
            elif st.head_lower is not None:  # rest: its read (the head's) drained the socket
                st.lower = st.head_lower
        fresh = True
        if peek is not None and not times:
            data, t, stamped = peek.peek(RECV)
            peeked = True
        else:
            data, t, stamped = read()
        if not data:
            st.ended_at = t
            if sc.done or (remaining is not None and remaining <= 0):
                return False
            raise Closed(got_bytes=True)


def _first_events(
    st: RequestState, payload: bytes, got: Read, dec: ChunkedDecoder | None, peek: Peek | None
) -> None:
    """Stamp the events of ``payload`` while no content event has come yet.

    ``got`` is the read (raw bytes, time, kernel-stamped); its bytes arrived no earlier
    than ``st.lower``. ``peek`` is given when they are still queued (peeked), to find
    the first event's own arrival where later bytes shared its read. Exact only from a
    kernel stamp; else the bound is the whole interval since ``st.lower``.
    """
    assert st.scanner is not None
    began_earlier = st.scanner.pending  # the event's first bytes came in an earlier read
    k, alone = st.scanner.feed_first(payload)
    if not k:
        return
    data, t, stamped = got
    t1, exact = t, stamped and alone and (dec is None or dec.between_chunks)
    if stamped and peek is not None and not exact and not began_earlier:
        # Peeking finds the event's end in this read's bytes; an event that began in an
        # earlier read is not whole in them (its mark is not), so its end is not searched
        # for: the read's stamp, bounded by the lower end, holds its arrival.
        t1, exact = peek.first_event_arrival(data, t)
    st.times.append(t1)
    if k > 1:
        st.times.extend([t] * (k - 1))
    if st.timing == "kernel":
        st.first_bound = 0.0 if exact else max(0.0, t1 - st.lower)


def read_body(read: Reader, head: ResponseHead, rest: bytes, t: float) -> tuple[bytes, float]:
    """Read a whole (non-streamed) body: (body, arrival of its last byte)."""
    if head.chunked:
        dec = ChunkedDecoder()
        parts = [dec.feed(rest)] if rest else []
        while not dec.done:
            data, t, _ = read()
            if not data:
                raise Closed(got_bytes=True)
            parts.append(dec.feed(data))
        return b"".join(parts), t
    if head.content_length is not None:
        parts = [rest]
        have = len(rest)
        while have < head.content_length:
            data, t, _ = read()
            if not data:
                raise Closed(got_bytes=True)
            parts.append(data)
            have += len(data)
        return b"".join(parts), t
    parts = [rest]
    while True:
        data, t, _ = read()
        if not data:
            return b"".join(parts), t
        parts.append(data)
